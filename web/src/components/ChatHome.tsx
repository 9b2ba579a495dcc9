// The chat's start screen: your sessions (open one to go on) and a form for a new one on a directory
// or git repository the server allows, with a policy and an approval mode.

import { useEffect, useState } from "preact/hooks";
import { api, ApiError, get, type Session } from "../lib/api";
import { when } from "../lib/format";
import type { Me } from "../lib/me";
import { href, navigate } from "../lib/route";
import { Problem } from "./Refused";

interface Suggestion { path: string; label: string }
interface Preset { name: string; policy: Record<string, unknown>; request?: string; workspace?: string | null }
interface Policies { kinds: string[]; openai_model?: string | null; presets?: Preset[] }

export function ChatHome({ me }: { me: Me }) {
  const [sessions, setSessions] = useState<Session[] | null>(null);
  const [error, setError] = useState<unknown>(null);
  useEffect(() => {
    api.listSessions({ kind: "user", limit: 50, ...(me.name ? { owner: me.name } : {}) })
      .then(setSessions, setError);
  }, [me.name]);
  return (
    <main id="main" class="page chat-home">
      <h1>Chat</h1>
      <div class="columns">
        <section aria-labelledby="new-h" class="panel">
          <h2 id="new-h">New session</h2>
          <NewSession />
        </section>
        <section aria-labelledby="mine-h" class="panel">
          <h2 id="mine-h">Your sessions</h2>
          <Problem error={error} />
          {sessions && !sessions.length && <p class="muted">None yet.</p>}
          {sessions && sessions.length > 0 && (
            <ul class="session-list">
              {sessions.map((s) => (
                <li key={s.id}>
                  <a href={href(["chat", s.id])}>{s.title || s.source.path || s.id}</a>
                  <span class="muted small"> · {s.status} · {s.turns} turn{s.turns === 1 ? "" : "s"} · {when(s.updated_at)}</span>
                </li>
              ))}
            </ul>
          )}
        </section>
      </div>
    </main>
  );
}

function NewSession() {
  const [suggested, setSuggested] = useState<Suggestion[]>([]);
  const [policies, setPolicies] = useState<Policies>({ kinds: ["scripted", "openai"] });
  const [source, setSource] = useState<"path" | "git">("path");
  const [path, setPath] = useState("");
  const [commit, setCommit] = useState("HEAD");
  const [policyKind, setPolicyKind] = useState("openai");
  const [model, setModel] = useState("");
  const [outputs, setOutputs] = useState("");
  const [mode, setMode] = useState("auto");
  const [title, setTitle] = useState("");
  const [error, setError] = useState<unknown>(null);
  const [busy, setBusy] = useState(false);

  useEffect(() => {
    get<{ suggested?: Suggestion[] }>("/v1/workspaces").then((w) => {
      setSuggested(w.suggested ?? []);
      if (w.suggested?.length) setPath((p) => p || w.suggested![0].path);
    }, () => undefined); // without the list the path field still works
    get<Policies>("/v1/policies").then((p) => {
      setPolicies(p);
      const demo = p.presets?.[0];
      if (demo) {
        setPolicyKind(`preset:${demo.name}`);
        if (demo.workspace) setPath((cur) => cur || demo.workspace!);
      } else if (!p.kinds.includes("openai")) setPolicyKind("scripted");
    }, () => undefined);
  }, []);

  function policy(): Record<string, unknown> {
    if (policyKind.startsWith("preset:")) {
      const preset = policies.presets?.find((p) => `preset:${p.name}` === policyKind);
      if (preset) return preset.policy;
    }
    if (policyKind === "scripted") {
      let parsed: unknown;
      try {
        parsed = JSON.parse(outputs);
      } catch {
        throw new ApiError(400, "scripted outputs must be a JSON list of strings");
      }
      if (Array.isArray(parsed)) return { kind: "scripted", outputs: parsed };
      // {"outputs": [...], "chunk_chars"?, "delay_s"?}: the recorded outputs file of `flywheel run --policy scripted:FILE`
      return { ...(parsed as object), kind: "scripted" };
    }
    return model ? { kind: "openai", model } : { kind: "openai" };
  }

  async function submit(e: Event) {
    e.preventDefault();
    setError(null);
    setBusy(true);
    try {
      const workspace = source === "path" ? { path } : { git: path, commit: commit || "HEAD" };
      const s = await api.createSession({ workspace, policy: policy(), title, approval_mode: mode });
      navigate(["chat", s.id]);
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  }

  return (
    <form onSubmit={submit} class="form" aria-label="new session">
      <fieldset>
        <legend>Workspace</legend>
        <div class="row">
          <label><input type="radio" name="src" checked={source === "path"} onChange={() => setSource("path")} /> directory</label>
          <label><input type="radio" name="src" checked={source === "git"} onChange={() => setSource("git")} /> git repository</label>
        </div>
        <label for="ws-path">{source === "path" ? "Directory on the server" : "Repository on the server"}</label>
        <input id="ws-path" list="ws-suggested" value={path} required placeholder="/path/under/an/allowed/root"
               onInput={(e) => setPath((e.target as HTMLInputElement).value)} />
        <datalist id="ws-suggested">
          {suggested.map((s) => <option key={s.path} value={s.path}>{s.label}</option>)}
        </datalist>
        {source === "git" && (
          <>
            <label for="ws-commit">Commit</label>
            <input id="ws-commit" value={commit} onInput={(e) => setCommit((e.target as HTMLInputElement).value)} />
          </>
        )}
      </fieldset>
      <label for="policy">Policy</label>
      <select id="policy" value={policyKind} onChange={(e) => setPolicyKind((e.target as HTMLSelectElement).value)}>
        {(policies.presets ?? []).map((p) => <option key={p.name} value={`preset:${p.name}`}>{p.name}</option>)}
        {policies.kinds.includes("openai") && <option value="openai">model server (openai)</option>}
        {policies.kinds.includes("scripted") && <option value="scripted">scripted outputs</option>}
      </select>
      {policyKind === "openai" && (
        <>
          <label for="model">Model (empty: the server's default{policies.openai_model ? `, ${policies.openai_model}` : ""})</label>
          <input id="model" value={model} onInput={(e) => setModel((e.target as HTMLInputElement).value)} />
        </>
      )}
      {policyKind === "scripted" && (
        <>
          <label for="outputs">Model outputs: a JSON list of strings, or {"{"}"outputs": [...], "chunk_chars": 24, "delay_s": 0{"}"}</label>
          <textarea id="outputs" rows={5} value={outputs} placeholder='["I will read the code.\n<tool_call name=\"read_file\">…"]'
                    onInput={(e) => setOutputs((e.target as HTMLTextAreaElement).value)} />
        </>
      )}
      <label for="mode">Ask before</label>
      <select id="mode" value={mode} onChange={(e) => setMode((e.target as HTMLSelectElement).value)}>
        <option value="auto">nothing (auto)</option>
        <option value="ask-commands">running a command</option>
        <option value="ask-edits">editing a file or running a command</option>
      </select>
      <label for="title">Title (optional)</label>
      <input id="title" value={title} maxLength={200} onInput={(e) => setTitle((e.target as HTMLInputElement).value)} />
      <button type="submit" class="primary" disabled={busy}>Start session</button>
      <Problem error={error} />
    </form>
  );
}
