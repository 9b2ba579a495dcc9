// The staff session browser: filters and full-text search, paginated on the server; the filters live
// in the URL hash so a view can be shared (no token in it). A row opens the session's replay.

import { useEffect, useState } from "preact/hooks";
import { api, type Session } from "../lib/api";
import { num, shortId, when } from "../lib/format";
import { href, navigate } from "../lib/route";
import { Problem } from "./Refused";

const PAGE = 50;
/** filter name -> label; names are the list route's query parameters */
const TEXT_FILTERS: [string, string][] = [
  ["q", "Search messages"], ["owner", "User"], ["policy", "Policy"], ["run", "RL run"], ["iteration", "Iteration"],
  ["task", "Task"], ["min_reward", "Reward ≥"], ["max_reward", "Reward ≤"], ["since", "From (date)"], ["until", "To (date)"],
];

export function SessionBrowser({ query }: { query: URLSearchParams }) {
  const filters = Object.fromEntries(query.entries());
  const offset = Number(filters.offset ?? 0) || 0;
  const [rows, setRows] = useState<Session[] | null>(null);
  const [more, setMore] = useState(false);
  const [error, setError] = useState<unknown>(null);
  const [draft, setDraft] = useState<Record<string, string>>(filters);
  const key = query.toString();

  useEffect(() => {
    setError(null);
    setDraft(Object.fromEntries(query.entries()));
    const params: Record<string, string | number> = { ...filters, limit: PAGE + 1, offset };
    api.listSessions(params).then((r) => {
      setRows(r.slice(0, PAGE));
      setMore(r.length > PAGE);
    }, (err) => {
      setRows(null);
      setError(err);
    });
  }, [key]);

  function apply(e: Event) {
    e.preventDefault();
    const q: Record<string, string> = {};
    for (const [k, v] of Object.entries(draft)) if (v && k !== "offset") q[k] = v;
    navigate(["sessions"], q);
  }
  const set = (k: string, v: string) => setDraft((d) => ({ ...d, [k]: v }));
  const page = (o: number) => href(["sessions"], { ...filters, offset: o || undefined });

  return (
    <main id="main" class="page browser">
      <h1>Sessions</h1>
      <form class="filters" onSubmit={apply} aria-label="filter sessions">
        {TEXT_FILTERS.map(([k, label]) => (
          <div key={k} class="field">
            <label for={`f-${k}`}>{label}</label>
            <input id={`f-${k}`} value={draft[k] ?? ""} type={k === "since" || k === "until" ? "date" : "text"}
                   onInput={(e) => set(k, (e.target as HTMLInputElement).value)} />
          </div>
        ))}
        <div class="field">
          <label for="f-kind">Kind</label>
          <select id="f-kind" value={draft.kind ?? ""} onChange={(e) => set("kind", (e.target as HTMLSelectElement).value)}>
            <option value="">any</option><option value="user">user session</option><option value="rl">RL rollout</option>
          </select>
        </div>
        <div class="field">
          <label for="f-status">Status</label>
          <select id="f-status" value={draft.status ?? ""} onChange={(e) => set("status", (e.target as HTMLSelectElement).value)}>
            <option value="">any</option><option value="idle">idle</option><option value="running">running</option><option value="cancelled">cancelled</option>
          </select>
        </div>
        <div class="field">
          <label for="f-feedback">Feedback</label>
          <select id="f-feedback" value={draft.feedback ?? ""} onChange={(e) => set("feedback", (e.target as HTMLSelectElement).value)}>
            <option value="">any</option><option value="any">has feedback</option><option value="up">thumbs up</option><option value="down">thumbs down</option>
            <option value="keep">kept edits</option><option value="revert">reverted edits</option><option value="none">none</option>
          </select>
        </div>
        <div class="field buttons">
          <button type="submit" class="primary">Apply</button>
          <a href={href(["sessions"])} class="small">clear</a>
        </div>
      </form>
      <Problem error={error} />
      {rows && (
        <>
          <table class="grid sessions">
            <caption class="visually-hidden">sessions matching the filters</caption>
            <thead><tr><th scope="col">Session</th><th scope="col">User</th><th scope="col">Kind</th><th scope="col">Status</th>
              <th scope="col">Policy</th><th scope="col">Turns</th><th scope="col">Reward</th><th scope="col">Updated</th></tr></thead>
            <tbody>
              {rows.map((s) => (
                <tr key={s.id}>
                  <td><a href={href(["replay", s.id])} title={s.id}>{s.title || shortId(s.id)}</a></td>
                  <td>{s.owner}</td>
                  <td>{s.kind === "rl" ? <>rl · <a href={href(["runs", s.rl_run ?? ""], { iteration: s.rl_iteration ?? undefined })}>{s.rl_run}</a> #{s.rl_iteration}</> : "user"}</td>
                  <td>{s.status}</td>
                  <td>{String(s.policy.kind ?? "")}{s.policy.model ? ` ${String(s.policy.model)}` : ""}</td>
                  <td>{s.turns}</td>
                  <td>{s.kind === "rl" ? num(s.rl_reward) : ""}</td>
                  <td>{when(s.updated_at)}</td>
                </tr>
              ))}
            </tbody>
          </table>
          {!rows.length && <p class="muted">No sessions match.</p>}
          <nav class="pager" aria-label="pages">
            {offset > 0 && <a href={page(Math.max(0, offset - PAGE))}>← newer</a>}
            <span class="small muted">{rows.length ? `${offset + 1}–${offset + rows.length}` : ""}</span>
            {more && <a href={page(offset + PAGE)}>older →</a>}
          </nav>
        </>
      )}
    </main>
  );
}
