// The session browser: filters and full-text search, keyset-paginated by the server
// (GET /v1/browse/sessions). The filters and the page's cursor live in the URL hash, so a view can
// be shared and the browser's Back button returns to the previous page (no token is ever in it).
// Users see their own sessions; staff see everyone's and RL rollouts.

import { useEffect, useState } from "preact/hooks";
import { api, type BrowsedSession, type Facets } from "../lib/api";
import { num, shortId, when } from "../lib/format";
import { href, navigate } from "../lib/route";
import { Problem } from "./Refused";

const PAGE = 50;
const TEXT_FILTERS: [string, string, string?][] = [
  ["q", "Search messages"], ["owner", "User", "owners"], ["policy", "Policy", "policies"], ["run", "RL run", "runs"],
  ["iteration", "Iteration"], ["task", "Task"], ["min_reward", "Reward at least"], ["max_reward", "Reward at most"],
  ["since", "Created from"], ["until", "Created before"],
];
const CHOICES: [string, string, [string, string][]][] = [
  ["kind", "Kind", [["user", "user session"], ["rl", "RL rollout"]]],
  ["status", "Status", [["idle", "idle"], ["running", "running"], ["cancelled", "cancelled"]]],
  ["feedback", "Feedback", [["any", "has feedback"], ["none", "no feedback"], ["up", "thumbs up"], ["down", "thumbs down"],
                            ["kept", "edits kept"], ["reverted", "edits reverted"]]],
];

export function SessionBrowser({ query }: { query: URLSearchParams }) {
  const filters = Object.fromEntries(query.entries());
  const [rows, setRows] = useState<BrowsedSession[] | null>(null);
  const [next, setNext] = useState<string | null>(null);
  const [facets, setFacets] = useState<Facets>({ owners: [], policies: [], runs: [] });
  const [error, setError] = useState<unknown>(null);
  const [draft, setDraft] = useState<Record<string, string>>(filters);
  const [ms, setMs] = useState<number | null>(null);
  const key = query.toString();

  useEffect(() => {
    api.facets().then(setFacets, () => undefined);
  }, []);
  useEffect(() => {
    setError(null);
    setDraft(Object.fromEntries(query.entries()));
    const t0 = performance.now();
    api.browse({ ...filters, limit: PAGE }).then((page) => {
      setRows(page.sessions);
      setNext(page.next_cursor);
      setMs(performance.now() - t0);
    }, (err) => {
      setRows(null);
      setError(err);
    });
  }, [key]);

  function apply(e: Event) {
    e.preventDefault();
    const q: Record<string, string> = {};
    for (const [k, v] of Object.entries(draft)) if (v && k !== "cursor") q[k] = v;
    navigate(["sessions"], q);
  }
  const set = (k: string, v: string) => setDraft((d) => ({ ...d, [k]: v }));
  const withCursor = (cursor?: string) => {
    const { cursor: _drop, ...rest } = filters;
    return href(["sessions"], { ...rest, cursor });
  };

  return (
    <main id="main" class="page browser">
      <h1>Sessions</h1>
      <form class="filters" onSubmit={apply} aria-label="filter sessions">
        {TEXT_FILTERS.map(([k, label, facet]) => (
          <div key={k} class="field">
            <label for={`f-${k}`}>{label}</label>
            <input id={`f-${k}`} value={draft[k] ?? ""} list={facet ? `facet-${facet}` : undefined}
                   type={k === "since" || k === "until" ? "date" : "text"}
                   onInput={(e) => set(k, (e.target as HTMLInputElement).value)} />
          </div>
        ))}
        {CHOICES.map(([k, label, options]) => (
          <div key={k} class="field">
            <label for={`f-${k}`}>{label}</label>
            <select id={`f-${k}`} value={draft[k] ?? ""} onChange={(e) => set(k, (e.target as HTMLSelectElement).value)}>
              <option value="">any</option>
              {options.map(([v, l]) => <option key={v} value={v}>{l}</option>)}
            </select>
          </div>
        ))}
        {(Object.entries(facets) as [string, string[]][]).map(([name, values]) => (
          <datalist key={name} id={`facet-${name}`}>{values.map((v) => <option key={v} value={v} />)}</datalist>
        ))}
        <div class="field buttons">
          <button type="submit" class="primary">Apply</button>
          <a href={href(["sessions"])} class="small">clear</a>
        </div>
      </form>
      <Problem error={error} />
      {rows && (
        <>
          <table class="grid sessions">
            <caption class="visually-hidden">sessions matching the filters, newest first</caption>
            <thead><tr><th scope="col">Session</th><th scope="col">User</th><th scope="col">Kind</th><th scope="col">Status</th>
              <th scope="col">Policy</th><th scope="col">Turns</th><th scope="col">Reward</th><th scope="col">Feedback</th>
              <th scope="col">Created</th></tr></thead>
            <tbody>
              {rows.map((s) => <Row key={s.id} s={s} />)}
            </tbody>
          </table>
          {!rows.length && <p class="muted">No sessions match.</p>}
          <nav class="pager" aria-label="pages">
            {filters.cursor && <a href={withCursor()}>first page</a>}
            {filters.cursor && <button type="button" class="linkish" onClick={() => history.back()}>previous page</button>}
            <span class="small muted">{rows.length} shown{ms !== null ? ` · ${Math.round(ms)} ms` : ""}</span>
            {next && <a href={withCursor(next)}>next page</a>}
          </nav>
        </>
      )}
    </main>
  );
}

function Row({ s }: { s: BrowsedSession }) {
  const fb = [
    s.feedback_up ? `${s.feedback_up} up` : "", s.feedback_down ? `${s.feedback_down} down` : "",
    s.files_kept ? `${s.files_kept} kept` : "", s.files_reverted ? `${s.files_reverted} reverted` : "",
  ].filter(Boolean).join(", ");
  return (
    <tr>
      <td>
        <a href={href(["replay", s.id])} title={s.id}>{s.title || shortId(s.id)}</a>
        {s.match && (
          <div class="snippet small">
            {s.match.snippet.map((seg, i) => (seg.match ? <mark key={i}>{seg.text}</mark> : <span key={i}>{seg.text}</span>))}
          </div>
        )}
      </td>
      <td>{s.owner}</td>
      <td>{s.kind === "rl" ? (
        <>rl · <a href={href(["runs", s.rl_run ?? ""], { iteration: s.rl_iteration ?? undefined })}>{s.rl_run}</a> #{s.rl_iteration}</>
      ) : "user"}</td>
      <td>{s.status}</td>
      <td>{String(s.policy_name ?? s.policy.kind ?? "")}</td>
      <td>{s.turns}</td>
      <td>{s.kind === "rl" ? num(s.rl_reward) : ""}</td>
      <td>{fb}</td>
      <td>{when(s.created_at)}</td>
    </tr>
  );
}
