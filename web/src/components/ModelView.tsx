// The conversation as the model saw it: each user message, each model output exactly as written
// (tool-call XML included: the `assistant_message` replay feeds back), and the tool results in call
// order (the order the model receives them), not in completion order as the live view shows them.
// Not guaranteed: the system prompt and the prompt template's formatting are not shown.

import type { BaseEvent } from "../lib/events";

interface Msg { role: "user" | "assistant" | "tool"; text: string; key: string; note?: string }

export function modelMessages(events: readonly BaseEvent[]): Msg[] {
  const order: (Msg | { results: string })[] = [];
  const byStep = new Map<string, { index: number; msg: Msg }[]>();
  for (const e of events) {
    const step = `${e.turn}:${String(e.step)}`;
    if (e.type === "user_message") order.push({ role: "user", text: String(e.text), key: `u${e.seq}` });
    else if (e.type === "assistant_message") {
      order.push({ role: "assistant", text: String(e.text), key: `a${e.seq}`,
                   note: e.finish_reason ? `finish: ${String(e.finish_reason)}` : undefined });
      order.push({ results: step });
    } else if (e.type === "tool_result") {
      const list = byStep.get(step) ?? [];
      list.push({ index: Number(e.index), msg: { role: "tool", text: String(e.output), key: String(e.call_id), note: String(e.name ?? "?") } });
      byStep.set(step, list);
    }
  }
  return order.flatMap((m) => ("results" in m ? (byStep.get(m.results) ?? []).sort((a, b) => a.index - b.index).map((r) => r.msg) : [m]));
}

export function ModelView({ events }: { events: readonly BaseEvent[] }) {
  const msgs = modelMessages(events);
  if (!msgs.length) return <p class="muted">Nothing yet at this point.</p>;
  return (
    <ol class="model-view">
      {msgs.map((m) => (
        <li key={m.key} class={`mv mv-${m.role}`}>
          <div class="small muted">{m.role}{m.note ? ` · ${m.note}` : ""}</div>
          <pre class="text">{m.text}</pre>
        </li>
      ))}
    </ol>
  );
}
