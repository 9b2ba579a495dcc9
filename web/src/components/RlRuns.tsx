// RL runs (staff only; the server refuses users with 403, which these screens show): the list of
// runs; per run, the curves recorded per iteration; per iteration, the rollouts behind a curve point,
// grouped by task with their rewards, each one click from its replay.

import { useEffect, useMemo, useState } from "preact/hooks";
import { get } from "../lib/api";
import { num, when } from "../lib/format";
import { href, navigate } from "../lib/route";
import { Chart } from "./Chart";
import { Problem } from "./Refused";

interface RunSummary {
  id: string; created_at: string; status: string; notes: string; iterations: number;
  last_iteration: number | null; rollouts: number; heldout_rollouts: number;
}
interface RunDetail {
  id: string; created_at: string; status: string; notes: string; config: Record<string, unknown>;
  iterations: number[]; series: Record<string, (number | null)[]>; panels: { title: string; keys: string[] }[];
}
interface Rollout {
  session_id: string; sample: number; reward: number | null; status: string | null; turns: number;
  output_tokens: number; created_at: string;
}
interface TaskGroup { task: string; mean_reward: number | null; best_reward: number | null; rollouts: Rollout[] }
interface IterationRollouts { run: string; iteration: number; split: string; tasks: TaskGroup[] }

const runPath = (id: string) => `/v1/rl/runs/${encodeURIComponent(id)}`;

export function RunList() {
  const [runs, setRuns] = useState<RunSummary[] | null>(null);
  const [error, setError] = useState<unknown>(null);
  useEffect(() => { get<RunSummary[]>("/v1/rl/runs").then(setRuns, setError); }, []);
  return (
    <main id="main" class="page">
      <h1>RL runs</h1>
      <Problem error={error} />
      {runs && !runs.length && <p class="muted">No RL runs are recorded in this server's log.</p>}
      {runs && runs.length > 0 && (
        <table class="grid">
          <caption class="visually-hidden">RL runs, newest first</caption>
          <thead><tr><th scope="col">Run</th><th scope="col">Status</th><th scope="col">Iterations</th>
            <th scope="col">Rollouts</th><th scope="col">Held-out rollouts</th><th scope="col">Started</th></tr></thead>
          <tbody>
            {runs.map((r) => (
              <tr key={r.id}>
                <td><a href={href(["runs", r.id])}>{r.id}</a>{r.notes && <div class="small muted">{r.notes}</div>}</td>
                <td>{r.status}</td><td>{r.iterations}</td><td>{r.rollouts}</td><td>{r.heldout_rollouts}</td>
                <td>{when(r.created_at)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </main>
  );
}

export function RunView({ id, iteration }: { id: string; iteration: string | null }) {
  const [run, setRun] = useState<RunDetail | null>(null);
  const [error, setError] = useState<unknown>(null);
  const [showAll, setShowAll] = useState(false);
  useEffect(() => { get<RunDetail>(runPath(id)).then(setRun, setError); }, [id]);
  const picked = iteration !== null && iteration !== "" ? Number(iteration) : undefined;
  const pick = (k: number) => navigate(["runs", id], { iteration: k });
  const others = useMemo(() => {
    if (!run) return [];
    const shown = new Set(run.panels.flatMap((p) => p.keys));
    return Object.keys(run.series).filter((k) => !shown.has(k)).sort();
  }, [run]);

  if (error) return <main id="main" class="page"><h1>RL run {id}</h1><Problem error={error} /></main>;
  if (!run) return <main id="main" class="page"><p class="muted">Loading the run…</p></main>;
  return (
    <main id="main" class="page run">
      <h1>RL run {run.id}</h1>
      <p class="small muted">{run.status} · started {when(run.created_at)} · {run.iterations.length} iterations{run.notes ? ` · ${run.notes}` : ""}</p>
      <div class="row">
        <label for="iteration">Rollouts of iteration</label>
        <select id="iteration" value={picked ?? ""} onChange={(e) => pick(Number((e.target as HTMLSelectElement).value))}>
          <option value="" disabled>pick one (or click a curve)</option>
          {run.iterations.map((k) => <option key={k} value={k}>{k}</option>)}
        </select>
        <label class="small"><input type="checkbox" checked={showAll} onChange={() => setShowAll(!showAll)} /> every recorded metric</label>
      </div>
      <div class="charts">
        {run.panels.map((p) => (
          <Chart key={p.title} title={p.title} keys={p.keys} iterations={run.iterations} series={run.series}
                 selected={picked} onPick={pick} />
        ))}
        {showAll && others.map((k) => (
          <Chart key={k} title={k} keys={[k]} iterations={run.iterations} series={run.series} selected={picked} onPick={pick} />
        ))}
      </div>
      {picked !== undefined && <Rollouts run={run.id} iteration={picked} />}
    </main>
  );
}

function Rollouts({ run, iteration }: { run: string; iteration: number }) {
  const [split, setSplit] = useState<"train" | "heldout">("train");
  const [data, setData] = useState<IterationRollouts | null>(null);
  const [error, setError] = useState<unknown>(null);
  useEffect(() => {
    setData(null);
    setError(null);
    get<IterationRollouts>(`${runPath(run)}/iterations/${iteration}/rollouts`, { split }).then(setData, setError);
  }, [run, iteration, split]);
  return (
    <section class="panel" aria-labelledby="rollouts-h">
      <div class="row">
        <h2 id="rollouts-h">Iteration {iteration}: rollouts by task</h2>
        <span class="spacer" />
        <label for="split" class="small">split</label>
        <select id="split" value={split} onChange={(e) => setSplit((e.target as HTMLSelectElement).value as "train" | "heldout")}>
          <option value="train">training</option>
          <option value="heldout">held-out evaluation</option>
        </select>
      </div>
      <Problem error={error} />
      {data && !data.tasks.length && <p class="muted">No rollouts recorded for this iteration.</p>}
      <div class="rollouts">
        {data?.tasks.map((t) => (
          <article key={t.task} class="card" aria-label={`task ${t.task}`}>
            <header class="card-head"><span class="card-name">{t.task}</span>
              <span class="card-time">mean {num(t.mean_reward)} · best {num(t.best_reward)}</span></header>
            <ul class="plain">
              {t.rollouts.map((r) => (
                <li key={r.session_id}>
                  <a href={href(["replay", r.session_id])}>sample {r.sample}</a>{" "}
                  <span class={r.reward !== null && r.reward > 0 ? "reward-ok" : "reward-bad"}>reward {num(r.reward)}</span>
                  <span class="small muted"> · {r.status ?? "unfinished"} · {r.output_tokens} tokens</span>
                </li>
              ))}
            </ul>
          </article>
        ))}
      </div>
    </section>
  );
}
