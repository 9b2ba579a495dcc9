// One reducer from events to what the screens show: turns, text blocks, tool-call cards with their
// status, output and edits. Chat (live), replay (up to a scrubber position) and the RL views all use it,
// so what a user saw live and what staff see in replay are built by the same code.
//
// The model is mutable for speed (a 5,000-event replay is folded in a few ms); `version` grows with
// every applied event so views can tell that something changed. Not guaranteed: events that break the
// protocol's order (a result before its call) still show, but in a card built from the later event.

import type {
  ApprovalRequested, ApprovalResolved, BaseEvent, FeedbackEvent, FileEdit, FlyEvent, ToolCallDelta, ToolCallStarted,
  ToolOutputDelta, ToolResult, TurnEnd,
} from "./events";
import { callId } from "./events";

export type CallStatus =
  | "writing" | "queued" | "approval" | "running" | "ok" | "failed" | "declined" | "cancelled" | "invalid";

export interface CallView {
  id: string;
  turn: number;
  step: number;
  index: number;
  name: string | null;
  args: Record<string, unknown>;
  /** parameter text streamed so far, while the model is still writing the call */
  preview: Record<string, string>;
  status: CallStatus;
  /** event times (server clock, Unix seconds) */
  parsedTs?: number;
  runTs?: number;
  endTs?: number;
  durationMs?: number;
  output: string;
  outputCut: boolean;
  result?: string;
  ok?: boolean;
  data?: Record<string, unknown>;
  edits: FileEdit[];
  approval?: { kind: string; open: boolean; approved?: boolean; reason?: string; by?: string };
  waitingFor: string[];
  firstSeq: number;
  lastSeq: number;
}

export type Block =
  | { kind: "text"; step: number; text: string; seq: number }
  | { kind: "calls"; step: number; calls: CallView[]; seq: number }
  | { kind: "error"; message: string; source: string; seq: number }
  | { kind: "feedback"; feedback: FeedbackEvent; seq: number };

export interface TurnView {
  turn: number;
  userText: string;
  startTs: number;
  firstSeq: number;
  blocks: Block[];
  end?: TurnEnd;
  outputTokens: number;
  /** the latest rating of this turn by each person */
  ratings: Map<string, FeedbackEvent>;
}

const FINAL: ReadonlySet<CallStatus> = new Set(["ok", "failed", "declined", "cancelled", "invalid"]);

export function isFinal(status: CallStatus): boolean {
  return FINAL.has(status);
}

export class Transcript {
  turns: TurnView[] = [];
  calls = new Map<string, CallView>();
  edits: FileEdit[] = [];
  /** the latest keep/revert verdict per file path (by anyone) */
  verdicts = new Map<string, FeedbackEvent>();
  feedbackCount = 0;
  lastSeq = 0;
  version = 0;
  /** events applied, of any type (also the ones the app does not know) */
  count = 0;

  /** Apply events in seq order; an event at or below `lastSeq` is a duplicate and ignored. */
  applyAll(events: readonly BaseEvent[]): void {
    for (const e of events) this.apply(e);
  }

  apply(raw: BaseEvent): boolean {
    if (raw.seq <= this.lastSeq) return false;
    this.lastSeq = raw.seq;
    this.count += 1;
    this.version += 1;
    const e = raw as FlyEvent;
    switch (e.type) {
      case "user_message":
        this.turns.push({ turn: e.turn, userText: e.text, startTs: e.ts, firstSeq: e.seq, blocks: [], outputTokens: 0, ratings: new Map() });
        break;
      case "assistant_delta": {
        const turn = this.turn(e);
        const last = turn.blocks[turn.blocks.length - 1];
        if (last && last.kind === "text" && last.step === e.step) last.text += e.text;
        else turn.blocks.push({ kind: "text", step: e.step, text: e.text, seq: e.seq });
        break;
      }
      case "tool_call_delta": {
        const call = this.call(e);
        if (call.status === "writing") call.preview[e.param] = (call.preview[e.param] ?? "") + e.text;
        break;
      }
      case "tool_call_started":
        this.started(e);
        break;
      case "tool_call_queued": {
        const call = this.call(e);
        call.status = "queued";
        call.waitingFor = e.waiting_for ?? [];
        break;
      }
      case "tool_call_running": {
        const call = this.call(e);
        call.status = "running";
        call.runTs = e.ts;
        break;
      }
      case "approval_requested":
        this.approvalRequested(e);
        break;
      case "approval_resolved":
        this.approvalResolved(e);
        break;
      case "tool_output_delta":
        this.outputDelta(e);
        break;
      case "tool_result":
        this.result(e);
        break;
      case "file_edit": {
        this.edits.push(e);
        const call = this.calls.get(e.call_id);
        if (call) {
          call.edits.push(e);
          call.lastSeq = e.seq;
        }
        break;
      }
      case "assistant_message":
        this.turn(e).outputTokens += e.output_tokens ?? 0;
        break;
      case "turn_end": {
        const turn = this.turn(e);
        turn.end = e;
        for (const block of turn.blocks) {
          if (block.kind !== "calls") continue;
          for (const call of block.calls) {
            // a call the model never finished writing never ran
            if (call.status === "writing") call.status = "cancelled";
            if (call.approval?.open) call.approval.open = false;
          }
        }
        break;
      }
      case "error":
        this.turn(e).blocks.push({ kind: "error", message: e.message, source: e.source, seq: e.seq });
        break;
      case "feedback":
        this.feedback(e);
        break;
      default:
        break; // a type this app does not know: ignored, as the protocol asks
    }
    return true;
  }

  /** The turn still running (the last one, without a turn_end), if any. */
  get runningTurn(): TurnView | undefined {
    const last = this.turns[this.turns.length - 1];
    return last && !last.end ? last : undefined;
  }

  openApprovals(): CallView[] {
    return [...this.calls.values()].filter((c) => c.approval?.open);
  }

  private turn(e: BaseEvent): TurnView {
    let turn = this.turns[this.turns.length - 1];
    if (!turn || turn.turn !== e.turn) {
      // a log that starts mid-turn (an events page) or a branch: a turn without its user message
      turn = { turn: e.turn, userText: "", startTs: e.ts, firstSeq: e.seq, blocks: [], outputTokens: 0, ratings: new Map() };
      this.turns.push(turn);
    }
    return turn;
  }

  private call(e: BaseEvent & { step: number; index: number; call_id?: string }): CallView {
    const id = e.call_id ?? callId(e.turn, e.step, e.index);
    let call = this.calls.get(id);
    if (call) {
      call.lastSeq = e.seq;
      return call;
    }
    call = {
      id, turn: e.turn, step: e.step, index: e.index, name: (e as ToolCallDelta).name ?? null, args: {},
      preview: {}, status: "writing", output: "", outputCut: false, edits: [], waitingFor: [],
      firstSeq: e.seq, lastSeq: e.seq,
    };
    this.calls.set(id, call);
    const turn = this.turn(e);
    let last = turn.blocks[turn.blocks.length - 1];
    const before = turn.blocks[turn.blocks.length - 2];
    if (last?.kind === "text" && !last.text.trim() && before?.kind === "calls" && before.step === e.step) {
      turn.blocks.pop(); // only whitespace between two calls of one step: they stay side by side
      last = before;
    }
    if (last && last.kind === "calls" && last.step === e.step) last.calls.push(call);
    else turn.blocks.push({ kind: "calls", step: e.step, calls: [call], seq: e.seq });
    return call;
  }

  private started(e: ToolCallStarted): void {
    const call = this.call(e);
    call.name = e.name;
    call.args = e.args ?? {};
    call.preview = {};
    call.parsedTs = e.ts;
    call.runTs = e.ts;
    call.status = e.valid === false ? "invalid" : "running";
  }

  private feedback(e: FeedbackEvent): void {
    this.feedbackCount += 1;
    if (e.target === "turn") {
      const turn = this.turns.find((t) => t.turn === e.of_turn);
      if (turn) turn.ratings.set(e.by, e);
      return;
    }
    if (e.path) this.verdicts.set(e.path, e);
    // a verdict on a file shows where it was given (a revert changed the workspace then)
    const last = this.turns[this.turns.length - 1];
    if (last) last.blocks.push({ kind: "feedback", feedback: e, seq: e.seq });
  }

  private approvalRequested(e: ApprovalRequested): void {
    const call = this.call(e);
    call.status = "approval";
    call.runTs = undefined;
    call.approval = { kind: e.kind, open: true };
  }

  private approvalResolved(e: ApprovalResolved): void {
    const call = this.call(e);
    call.approval = { ...(call.approval ?? { kind: "command" }), open: false, approved: e.approved, reason: e.reason, by: e.by };
    if (!e.approved) call.status = "declined";
  }

  private outputDelta(e: ToolOutputDelta): void {
    const call = this.call(e);
    call.output += e.text;
    if (e.cut) call.outputCut = true;
  }

  private result(e: ToolResult): void {
    const call = this.call(e);
    call.result = e.output;
    call.ok = e.ok;
    call.data = e.data ?? {};
    call.durationMs = e.duration_ms;
    call.endTs = e.ts;
    if (call.approval) call.approval.open = false;
    if (call.status === "invalid") return;
    if (e.data?.declined) call.status = "declined";
    else if (e.data?.cancelled || /^cancelled: /.test(e.output)) call.status = "cancelled";
    else call.status = e.ok ? "ok" : "failed";
  }
}

/** Fold `events` into a fresh transcript. */
export function fold(events: readonly BaseEvent[]): Transcript {
  const t = new Transcript();
  t.applyAll(events);
  return t;
}
