// Re-execute a recording from its starting workspace (POST .../reexecute) and show, call by call,
// what differs: recorded and replayed outputs side by side, as a diff drawn by diff2html.

import { createTwoFilesPatch } from "diff";
import { useState } from "preact/hooks";
import { api, type CallComparison, type ReexecuteReport } from "../lib/api";
import { argSummary, duration } from "../lib/format";
import { DiffView } from "./DiffView";
import { Problem } from "./Refused";

export function Reexecute({ sessionId }: { sessionId: string }) {
  const [report, setReport] = useState<ReexecuteReport | null>(null);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<unknown>(null);
  const [onlyDiffering, setOnlyDiffering] = useState(true);

  async function run() {
    setBusy(true);
    setError(null);
    try {
      setReport(await api.reexecute(sessionId));
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  }
  const shown = report?.calls.filter((c) => !onlyDiffering || c.status !== "same") ?? [];
  return (
    <section class="panel" aria-labelledby="reexec-h">
      <h2 id="reexec-h">Re-execute</h2>
      <p class="small muted">Restore the starting workspace, feed the recorded model outputs through the same parser and tools, compare each call.</p>
      <button type="button" onClick={run} disabled={busy}>{busy ? "Re-executing…" : "Re-execute"}</button>
      <Problem error={error} />
      {report && (
        <div class="reexec-report" aria-live="polite">
          <p class="counts">
            {(["same", "differs", "missing", "extra"] as const).map((k) => (
              <span key={k} class={`count count-${k}`}>{report.counts[k] ?? 0} {k}</span>
            ))}
          </p>
          <label class="small"><input type="checkbox" checked={onlyDiffering} onChange={() => setOnlyDiffering(!onlyDiffering)} /> only calls that differ</label>
          {shown.length === 0 && <p class="muted">Every call gave the same result.</p>}
          <ol class="comparisons">
            {shown.map((c) => <Comparison key={c.call_id} c={c} />)}
          </ol>
          {report.reverts && report.reverts.length > 0 && (
            <>
              <h3>Reverts re-applied</h3>
              <ul class="small">
                {report.reverts.map((r) => (
                  <li key={`${r.turn}:${r.path}`}>after turn {r.turn}: <code>{r.path}</code> {r.ok ? "reverted again" : `not re-applied: ${r.detail}`}</li>
                ))}
              </ul>
            </>
          )}
        </div>
      )}
    </section>
  );
}

function Comparison({ c }: { c: CallComparison }) {
  const recorded = c.recorded_output ?? "";
  const replayed = c.replayed_output ?? "";
  const outputDiffers = c.status === "differs" && (c.differs_in?.includes("output") ?? recorded !== replayed);
  const editsDiffer = c.differs_in?.includes("edits");
  return (
    <li class={`comparison status-${c.status}`} data-call-id={c.call_id}>
      <div class="row">
        <strong>{c.name ?? "?"}</strong> <code class="small">{c.call_id}</code>
        <span class={`badge badge-${c.status}`}>{c.status}{c.differs_in?.length ? `: ${c.differs_in.join(", ")}` : ""}</span>
        <span class="small muted">
          recorded {okText(c.recorded_ok)} {duration(c.recorded_duration_ms ?? undefined)} · replayed {okText(c.replayed_ok)} {duration(c.replayed_duration_ms ?? undefined)}
        </span>
      </div>
      {c.args && <div class="card-args">{argSummary(c.args)}</div>}
      {outputDiffers ? (
        <DiffView sideBySide label={`recorded vs replayed output of ${c.call_id}`}
                  diff={createTwoFilesPatch("recorded", "replayed", ensureNl(recorded), ensureNl(replayed), "", "", { context: 3 })} />
      ) : (
        <div class="side-by-side">
          <div><h3 class="small">recorded</h3><pre class="card-output" tabIndex={0}>{c.recorded_output ?? "(same as replayed)"}</pre></div>
          <div><h3 class="small">replayed</h3><pre class="card-output" tabIndex={0}>{c.replayed_output ?? "(same as recorded)"}</pre></div>
        </div>
      )}
      {editsDiffer && (
        <div class="side-by-side">
          <div><h3 class="small">recorded edits</h3>{(c.recorded_edits ?? []).map((d, i) => <DiffView key={i} diff={d} label="recorded edit" />)}</div>
          <div><h3 class="small">replayed edits</h3>{(c.replayed_edits ?? []).map((d, i) => <DiffView key={i} diff={d} label="replayed edit" />)}</div>
        </div>
      )}
    </li>
  );
}

const okText = (ok: boolean | null | undefined) => (ok === true ? "ok" : ok === false ? "failed" : "—");
const ensureNl = (s: string) => (s.endsWith("\n") ? s : `${s}\n`);
