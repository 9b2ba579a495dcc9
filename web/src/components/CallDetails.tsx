// A call's details in replay: its arguments, output, diff, status and how long it ran.

import { duration } from "../lib/format";
import type { CallView } from "../lib/transcript";
import { DiffView } from "./DiffView";

export function CallDetails({ call, onClose }: { call: CallView; onClose: () => void }) {
  const waited = call.parsedTs !== undefined && call.runTs !== undefined ? call.runTs - call.parsedTs : 0;
  return (
    <section class="panel details" aria-labelledby="details-h">
      <header class="row">
        <h2 id="details-h">{call.name ?? "(unknown tool)"} <code class="small">{call.id}</code></h2>
        <span class="spacer" />
        <button type="button" class="small" onClick={onClose}>Close</button>
      </header>
      <dl class="facts">
        <dt>status</dt><dd>{call.status}</dd>
        <dt>ran for</dt><dd>{call.durationMs !== undefined ? duration(call.durationMs) : "not finished here"}</dd>
        {waited > 0.0005 && (<><dt>waited</dt><dd>{duration(waited * 1000)} (queued or awaiting approval)</dd></>)}
        <dt>model step</dt><dd>turn {call.turn}, step {call.step}, call {call.index}</dd>
      </dl>
      <h3>Arguments</h3>
      <pre class="code" tabIndex={0}>{JSON.stringify(call.args, null, 2)}</pre>
      {call.output && call.output !== call.result && (<><h3>Live output</h3><pre class="card-output" tabIndex={0}>{call.output}</pre></>)}
      <h3>Output</h3>
      <pre class="card-output" tabIndex={0}>{call.result ?? "(no result yet at this point of the replay)"}</pre>
      {call.data && Object.keys(call.data).length > 0 && (<><h3>Data</h3><pre class="code" tabIndex={0}>{JSON.stringify(call.data, null, 2)}</pre></>)}
      {call.edits.length > 0 && <h3>Diff</h3>}
      {call.edits.map((e) => <DiffView key={e.seq} diff={e.diff} label={`diff of ${e.path}`} />)}
    </section>
  );
}
