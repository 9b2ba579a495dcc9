// One tool call as a card: name and arguments from the moment the model wrote them, a live status and
// timer, streamed command output, the result, and each edit as a highlighted diff. With `onApprove`
// an open approval request shows Allow / Decline; with `onSelect` the card opens the call's details
// (replay). Everything the model or a tool wrote is rendered as text (Preact escapes it) or through
// diff2html/highlight.js (which escape it).

import { useState } from "preact/hooks";
import { argSummary, duration } from "../lib/format";
import { highlight, languageOf } from "../lib/highlight";
import { type CallView, isFinal } from "../lib/transcript";
import { DiffView } from "./DiffView";
import { Elapsed } from "./Elapsed";

const STATUS_LABEL: Record<string, string> = {
  writing: "writing", queued: "queued", approval: "needs approval", running: "running", ok: "done",
  failed: "failed", declined: "declined", cancelled: "cancelled", invalid: "invalid",
};

export interface ToolCardProps {
  call: CallView;
  /** replay: the time the view stands at (server seconds); freezes running timers there */
  frozenAt?: number;
  onApprove?: (call: CallView, approved: boolean, reason: string) => void;
  onSelect?: (call: CallView) => void;
  selected?: boolean;
}

export function ToolCard({ call, frozenAt, onApprove, onSelect, selected }: ToolCardProps) {
  const summary = argSummary(call.status === "writing" ? call.preview : call.args);
  const running = !isFinal(call.status);
  const start = call.runTs ?? call.parsedTs;
  return (
    <article
      class={`card status-${call.status}${selected ? " selected" : ""}`}
      aria-label={`tool call ${call.name ?? "?"} ${STATUS_LABEL[call.status]}`}
      data-call-id={call.id}
    >
      <header class="card-head">
        {onSelect ? (
          <button type="button" class="card-name linkish" onClick={() => onSelect(call)} aria-label={`details of ${call.id}`}>
            {call.name ?? "(unknown tool)"}
          </button>
        ) : (
          <span class="card-name">{call.name ?? "(unknown tool)"}</span>
        )}
        <span class={`badge badge-${call.status}`}>{STATUS_LABEL[call.status]}</span>
        <span class="card-time">
          {running ? <Elapsed from={start} frozenAt={frozenAt} /> : duration(call.durationMs)}
        </span>
      </header>
      {summary && <div class="card-args" title={summary}>{summary}</div>}
      {call.status === "writing" && <Preview call={call} />}
      {call.status === "queued" && call.waitingFor.length > 0 && (
        <div class="card-note">waiting for {call.waitingFor.join(", ")}</div>
      )}
      {call.approval?.open && onApprove && <ApprovalPrompt call={call} onApprove={onApprove} />}
      {call.approval && !call.approval.open && call.approval.approved !== undefined && (
        <div class="card-note">
          {call.approval.approved ? "allowed" : "declined"} by {call.approval.by}
          {call.approval.reason ? `: ${call.approval.reason}` : ""}
        </div>
      )}
      {call.output && call.result === undefined && (
        <pre class="card-output live" aria-live="off" tabIndex={0}>{call.output}{call.outputCut ? "\n… (live output cut)" : ""}</pre>
      )}
      {call.result !== undefined && <Result call={call} />}
      {call.edits.map((e) => (
        <DiffView key={e.seq} diff={e.diff} label={`diff of ${e.path}`} />
      ))}
    </article>
  );
}

function Preview({ call }: { call: CallView }) {
  const entries = Object.entries(call.preview);
  if (!entries.length) return null;
  return (
    <div class="card-preview">
      {entries.map(([param, text]) => (
        <div key={param}>
          <span class="param">{param}</span>
          <pre class="code" tabIndex={0}>{text}</pre>
        </div>
      ))}
    </div>
  );
}

function Result({ call }: { call: CallView }) {
  const text = call.result ?? "";
  const long = text.length > 400 || text.split("\n").length > 8;
  const [open, setOpen] = useState(call.name === "run_command" || !long);
  if (call.name === "edit_file" && call.ok && call.edits.length) return null; // the diff says it all
  const path = typeof call.args.path === "string" ? call.args.path : "";
  const lang = call.name === "read_file" ? languageOf(path) : undefined;
  return (
    <div class="card-result">
      {long && (
        <button type="button" class="linkish small" aria-expanded={open} onClick={() => setOpen(!open)}>
          {open ? "hide output" : `show output (${text.split("\n").length} lines)`}
        </button>
      )}
      {open && (lang ? (
        // highlight.js escapes the text before adding its spans
        <pre class="card-output hljs" tabIndex={0} dangerouslySetInnerHTML={{ __html: highlight(text, lang) }} />
      ) : (
        <pre class="card-output" tabIndex={0}>{text}</pre>
      ))}
    </div>
  );
}

function ApprovalPrompt({ call, onApprove }: { call: CallView; onApprove: NonNullable<ToolCardProps["onApprove"]> }) {
  const [reason, setReason] = useState("");
  const id = `reason-${call.id}`;
  return (
    <div class="approval" role="group" aria-label={`approve ${call.name}`}>
      <div>The agent wants to {call.approval?.kind === "edit" ? "change files" : "run a command"}:</div>
      <label for={id} class="small">Reason (optional, the model reads it if you decline)</label>
      <input id={id} value={reason} maxLength={2000} onInput={(e) => setReason((e.target as HTMLInputElement).value)} />
      <div class="row">
        <button type="button" class="primary" onClick={() => onApprove(call, true, reason)}>Allow</button>
        <button type="button" onClick={() => onApprove(call, false, reason)}>Decline</button>
      </div>
    </div>
  );
}
