// Branch a session from model step k with another policy (POST .../branch): the new session
// re-executes the first k model calls, then continues. Links go both ways (the child's parent_id,
// the parent's list of branches).

import { useEffect, useState } from "preact/hooks";
import { api, type Session } from "../lib/api";
import { href } from "../lib/route";
import { Problem } from "./Refused";

export function Branch({ session, step, steps }: { session: Session; step: number; steps: number }) {
  const [fromStep, setFromStep] = useState(step);
  const [kind, setKind] = useState("scripted");
  const [model, setModel] = useState("");
  const [outputs, setOutputs] = useState('["Continuing from here in a branch."]');
  const [made, setMade] = useState<Session | null>(null);
  const [error, setError] = useState<unknown>(null);
  useEffect(() => setFromStep(step), [step]);

  async function submit(e: Event) {
    e.preventDefault();
    setError(null);
    try {
      let policy: Record<string, unknown>;
      if (kind === "scripted") {
        const list = JSON.parse(outputs);
        if (!Array.isArray(list)) throw new Error("outputs must be a JSON list of strings");
        policy = { kind: "scripted", outputs: list };
      } else policy = model ? { kind: "openai", model } : { kind: "openai" };
      setMade(await api.branch(session.id, { from_step: fromStep, policy, auto_continue: true }));
    } catch (err) {
      setError(err instanceof SyntaxError ? new Error("outputs must be a JSON list of strings") : err);
    }
  }
  return (
    <section class="panel" aria-labelledby="branch-h">
      <h2 id="branch-h">Branch from a step</h2>
      <form class="form" onSubmit={submit} aria-label="branch">
        <label for="from-step">From model step (0–{steps}): re-execute this many model calls, then continue</label>
        <input id="from-step" type="number" min={0} max={steps} value={fromStep}
               onInput={(e) => setFromStep(Number((e.target as HTMLInputElement).value))} />
        <label for="branch-policy">Policy for the continuation</label>
        <select id="branch-policy" value={kind} onChange={(e) => setKind((e.target as HTMLSelectElement).value)}>
          <option value="scripted">scripted outputs</option>
          <option value="openai">model server (openai)</option>
        </select>
        {kind === "openai" ? (
          <>
            <label for="branch-model">Model (empty: the server's default)</label>
            <input id="branch-model" value={model} onInput={(e) => setModel((e.target as HTMLInputElement).value)} />
          </>
        ) : (
          <>
            <label for="branch-outputs">Model outputs (a JSON list of strings)</label>
            <textarea id="branch-outputs" rows={3} value={outputs} onInput={(e) => setOutputs((e.target as HTMLTextAreaElement).value)} />
          </>
        )}
        <button type="submit">Branch</button>
      </form>
      <Problem error={error} />
      {made && (
        <p role="status">
          Branched: <a href={href(["replay", made.id])}>replay {made.id}</a> · <a href={href(["chat", made.id])}>chat in it</a>
        </p>
      )}
    </section>
  );
}

/** The sessions around this one: the parent it branched from, and its own branches. */
export function Lineage({ session }: { session: Session }) {
  const [children, setChildren] = useState<Session[]>([]);
  useEffect(() => {
    api.branches(session.id).then(setChildren, () => setChildren([]));
  }, [session.id]);
  if (!session.parent_id && !children.length) return null;
  return (
    <p class="lineage small">
      {session.parent_id && (
        <>branched from <a href={href(["replay", session.parent_id])}>{session.parent_id}</a> at step {session.branch_step}. </>
      )}
      {children.length > 0 && (
        <>branches: {children.map((c, i) => (
          <span key={c.id}>{i ? ", " : ""}<a href={href(["replay", c.id])}>{c.id}</a> (step {c.branch_step})</span>
        ))}</>
      )}
    </p>
  );
}
