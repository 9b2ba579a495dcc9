// The conversation: each turn's request, the model's text as it streams, its tool calls (the calls
// of one model step side by side), errors and how the turn ended. Used live (chat) and in replay.

import type { ComponentChildren } from "preact";
import type { FeedbackEvent } from "../lib/events";
import type { CallView, Transcript, TurnView } from "../lib/transcript";
import { DiffView } from "./DiffView";
import { Icon } from "./Icon";
import { ToolCard, type ToolCardProps } from "./ToolCard";

export interface TranscriptViewProps {
  transcript: Transcript;
  /** bump to re-render (the transcript is mutated in place) */
  version: number;
  frozenAt?: number;
  onApprove?: ToolCardProps["onApprove"];
  onSelect?: (call: CallView) => void;
  selectedCall?: string;
  turnFooter?: (turn: TurnView) => ComponentChildren;
}

const END_LABEL: Record<string, string> = {
  completed: "completed", max_steps: "stopped: step limit", max_tokens: "stopped: token limit",
  timeout: "stopped: time limit", interrupted: "interrupted", shutdown: "stopped: the server shut down",
  error: "ended with an error",
};

export function TranscriptView(props: TranscriptViewProps) {
  const { transcript } = props;
  if (!transcript.turns.length) return <p class="muted">No messages yet.</p>;
  return (
    <ol class="transcript" aria-label="conversation">
      {transcript.turns.map((turn) => (
        <li key={turn.firstSeq} class="turn" data-turn={turn.turn}>
          {turn.userText && (
            <div class="msg user" aria-label="your message">
              <pre class="text">{turn.userText}</pre>
            </div>
          )}
          {turn.blocks.map((block) => {
            if (block.kind === "text") {
              if (!block.text.trim()) return null;
              return (
                <div key={block.seq} class="msg assistant" aria-label="assistant">
                  <pre class="text">{block.text.trim()}</pre>
                </div>
              );
            }
            if (block.kind === "error") {
              return <div key={block.seq} class="msg error" role="alert">{block.source} error: {block.message}</div>;
            }
            if (block.kind === "feedback") return <FileVerdict key={block.seq} f={block.feedback} />;
            return (
              <div key={block.seq} class={`calls${block.calls.length > 1 ? " parallel" : ""}`}
                   aria-label={`step ${block.step}: ${block.calls.length} tool call${block.calls.length > 1 ? "s" : ""}`}>
                {block.calls.map((call) => (
                  <ToolCard key={call.id} call={call} frozenAt={props.frozenAt} onApprove={props.onApprove}
                            onSelect={props.onSelect} selected={props.selectedCall === call.id} />
                ))}
              </div>
            );
          })}
          {turn.end ? (
            <div class={`turn-end reason-${turn.end.reason}`}>
              {END_LABEL[turn.end.reason] ?? turn.end.reason} · {turn.end.steps} step{turn.end.steps === 1 ? "" : "s"} ·{" "}
              {turn.end.output_tokens} tokens{turn.end.detail ? ` · ${turn.end.detail}` : ""}
            </div>
          ) : (
            props.frozenAt === undefined && <div class="turn-end running" aria-live="polite">working…</div>
          )}
          {turn.ratings.size > 0 && <Ratings ratings={[...turn.ratings.values()]} />}
          {props.turnFooter?.(turn)}
        </li>
      ))}
    </ol>
  );
}

function Ratings({ ratings }: { ratings: FeedbackEvent[] }) {
  return (
    <ul class="ratings small" aria-label="feedback on this turn">
      {ratings.map((r) => (
        <li key={r.by}>
          <Icon name={r.rating === "up" ? "up" : "down"} /> {r.by} rated this turn {r.rating === "up" ? "good" : "bad"}
          {r.comment ? `: “${r.comment}”` : ""}
        </li>
      ))}
    </ul>
  );
}

function FileVerdict({ f }: { f: FeedbackEvent }) {
  return (
    <div class={`verdict-note verdict-${f.verdict}`}>
      <span>{f.by} {f.verdict === "revert" ? "reverted" : "kept"} <code>{f.path}</code>{f.comment ? `: “${f.comment}”` : ""}</span>
      {f.verdict === "revert" && f.diff && <DiffView diff={f.diff} label={`what reverting ${f.path} changed`} />}
    </div>
  );
}
