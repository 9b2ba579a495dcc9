// A live session: the conversation streaming in over the WebSocket, a box to send the next request,
// Interrupt while a turn runs, approval prompts on the cards, the connection's state (it resumes by
// seq after a drop), and the workspace panel with the session's changes.

import { useEffect, useMemo, useRef, useState } from "preact/hooks";
import { api, type Session } from "../lib/api";
import { observeLive } from "../lib/clock";
import { href } from "../lib/route";
import { SessionStream, type StreamStatus } from "../lib/stream";
import { Transcript } from "../lib/transcript";
import { TurnFeedback } from "./Feedback";
import { Problem } from "./Refused";
import { TranscriptView } from "./TranscriptView";
import { WorkspacePanel } from "./WorkspacePanel";

export function Chat({ id, me }: { id: string; me: string }) {
  const transcript = useMemo(() => new Transcript(), [id]);
  const [version, setVersion] = useState(0);
  const [session, setSession] = useState<Session | null>(null);
  const [status, setStatus] = useState<StreamStatus>({ state: "connecting", detail: "", connects: 0 });
  const [error, setError] = useState<unknown>(null);
  const [text, setText] = useState("");
  const stream = useRef<SessionStream | null>(null);
  const scroller = useRef<HTMLDivElement>(null);
  const stick = useRef(true);

  useEffect(() => {
    setError(null);
    api.session(id).then(setSession, setError);
    const s = new SessionStream(id, 0, {
      onEvents(events) {
        for (const e of events) observeLive(e.ts);
        transcript.applyAll(events);
        setVersion(transcript.version);
      },
      onStatus: setStatus,
      onRequestError: (e) => {
        setSentAt(null);
        setError(new Error(`${e.message} (${e.status})`));
      },
    });
    stream.current = s;
    return () => s.close();
  }, [id]);

  useEffect(() => {
    const el = scroller.current;
    if (el && stick.current) el.scrollTop = el.scrollHeight;
  }, [version]);

  const [sentAt, setSentAt] = useState<number | null>(null); // turns seen when a message was sent
  const running = transcript.runningTurn !== undefined || (sentAt !== null && transcript.turns.length === sentAt);

  async function send(e?: Event) {
    e?.preventDefault();
    const body = text.trim();
    if (!body || running) return;
    setError(null);
    setSentAt(transcript.turns.length);
    const sent = stream.current?.send({ type: "user_message", text: body });
    try {
      if (!sent) await api.send(id, body); // the socket is down: REST starts the turn, the stream catches up
      setText("");
    } catch (err) {
      setSentAt(null);
      setError(err);
    }
  }

  async function interrupt() {
    if (!stream.current?.send({ type: "interrupt" })) {
      try {
        await api.interrupt(id);
      } catch (err) {
        setError(err);
      }
    }
  }

  function onKey(e: KeyboardEvent) {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) void send(e);
  }

  const edits = transcript.edits.length;
  const ended = transcript.turns.filter((t) => t.end).length;
  const refresh = `${edits}:${ended}:${transcript.feedbackCount}`;
  return (
    <main id="main" class="page chat">
      <div class="chat-main">
        <header class="chat-head">
          <h1>{session?.title || session?.source.path || "Session"}</h1>
          <ConnectionBadge status={status} onRetry={() => stream.current?.reconnectNow()} />
          <a href={href(["replay", id])} class="small">replay</a>
        </header>
        <div class="scroll" ref={scroller} onScroll={(e) => {
          const el = e.currentTarget as HTMLDivElement;
          stick.current = el.scrollHeight - el.scrollTop - el.clientHeight < 80;
        }}>
          <TranscriptView
            transcript={transcript} version={version}
            onApprove={(call, approved, reason) => stream.current?.send({ type: "approval", call_id: call.id, approved, reason })}
            turnFooter={(turn) => (turn.end ? <TurnFeedback sessionId={id} turn={turn.turn} given={turn.ratings.get(me)} /> : null)}
          />
        </div>
        <Problem error={error} />
        <form class="composer" onSubmit={send} aria-label="message">
          <label for="prompt" class="visually-hidden">Message to the agent</label>
          <textarea id="prompt" rows={3} value={text} placeholder={running ? "The agent is working…" : "Ask the agent (Enter sends, Shift+Enter: new line)"}
                    onInput={(e) => setText((e.target as HTMLTextAreaElement).value)} onKeyDown={onKey}
                    disabled={session?.status === "cancelled"} />
          <div class="composer-buttons">
            {running ? (
              <button type="button" class="danger" onClick={interrupt}>Interrupt</button>
            ) : (
              <button type="submit" class="primary" disabled={!text.trim() || session?.status === "cancelled"}>Send</button>
            )}
          </div>
        </form>
      </div>
      <WorkspacePanel sessionId={id} refresh={refresh} verdicts={transcript.verdicts} />
    </main>
  );
}

function ConnectionBadge({ status, onRetry }: { status: StreamStatus; onRetry: () => void }) {
  const label = {
    connecting: "connecting…", open: "live", reconnecting: "reconnecting…", closed: "closed", failed: "disconnected",
  }[status.state];
  return (
    <span class={`conn conn-${status.state}`} role="status" aria-live="polite" data-state={status.state}>
      {label}
      {status.detail && <span class="small"> — {status.detail}</span>}
      {status.state === "reconnecting" && (
        <button type="button" class="linkish small" onClick={onRetry}>retry now</button>
      )}
    </span>
  );
}
