// The conversation as the model saw it at the replay's position: the server renders it from the log
// (GET .../conversation?upto=SEQ: the system prompt, each user message, each model output exactly as
// written with its tool-call XML, and the tool results in call order, as the model received them).
// Not guaranteed: the system prompt is rendered with the server's current tool set and default
// prompt profile, which may differ from the recording's.

import { useEffect, useState } from "preact/hooks";
import { api, type ConversationMessage } from "../lib/api";
import { Problem } from "./Refused";

export function ModelView({ sessionId, upto }: { sessionId: string; upto: number }) {
  const [msgs, setMsgs] = useState<ConversationMessage[] | null>(null);
  const [error, setError] = useState<unknown>(null);
  useEffect(() => {
    const timer = window.setTimeout(() => {
      api.conversation(sessionId, upto).then((c) => { setMsgs(c.messages); setError(null); }, setError);
    }, 150); // scrubbing asks once it settles
    return () => window.clearTimeout(timer);
  }, [sessionId, upto]);
  if (error) return <Problem error={error} />;
  if (!msgs) return <p class="muted">Loading…</p>;
  return (
    <ol class="model-view" aria-label="messages the model read">
      {msgs.map((m, i) => (
        <li key={`${m.seq}-${i}`} class={`mv mv-${m.role}`}>
          {m.role === "system" ? (
            <details><summary class="small muted">system prompt</summary><pre class="text">{m.content}</pre></details>
          ) : (
            <>
              <div class="small muted">{m.role}{m.seq !== null ? ` · event ${m.seq}` : ""}</div>
              <pre class="text">{m.content}</pre>
            </>
          )}
        </li>
      ))}
    </ol>
  );
}
