// The session's workspace: the files it changed, the combined diff, a patch to download, and a
// keep/revert verdict per file (feedback on the edits). Refreshed when an edit or a turn lands.

import { useEffect, useState } from "preact/hooks";
import { api, type DiffBody } from "../lib/api";
import type { FeedbackEvent } from "../lib/events";
import { feedback } from "../lib/feedback";
import { DiffView } from "./DiffView";
import { Problem } from "./Refused";

export function WorkspacePanel({ sessionId, refresh, verdicts }: {
  sessionId: string; refresh: string; verdicts: Map<string, FeedbackEvent>;
}) {
  const [diff, setDiff] = useState<DiffBody | null>(null);
  const [busy, setBusy] = useState("");
  const [error, setError] = useState<unknown>(null);
  const [sideBySide, setSideBySide] = useState(false);

  useEffect(() => {
    api.diff(sessionId).then((d) => { setDiff(d); setError(null); }, setError);
  }, [sessionId, refresh]);
  async function judge(path: string, verdict: "keep" | "revert") {
    setError(null);
    setBusy(path);
    try {
      await feedback.judgeFile(sessionId, path, verdict); // the feedback event refreshes the panel
    } catch (err) {
      setError(err);
    } finally {
      setBusy("");
    }
  }
  const verdictOf = (path: string) => verdicts.get(path)?.verdict;

  function download() {
    if (!diff) return;
    const url = URL.createObjectURL(new Blob([diff.diff], { type: "text/x-diff" }));
    const a = document.createElement("a");
    a.href = url;
    a.download = `session-${sessionId}.patch`;
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  }

  return (
    <aside class="workspace panel" aria-labelledby="ws-h">
      <h2 id="ws-h">Workspace changes</h2>
      <Problem error={error} />
      {diff && !diff.files.length && <p class="muted">No files changed yet.</p>}
      {diff && diff.files.length > 0 && (
        <>
          <ul class="files" aria-label="changed files">
            {diff.files.map((f) => (
              <li key={f.path}>
                <span class={`kind kind-${f.kind}`}>{f.kind}</span> <code>{f.path}</code>
                <span class="verdict" role="group" aria-label={`keep or revert ${f.path}`}>
                  <button type="button" class={`small${verdictOf(f.path) === "keep" ? " on" : ""}`}
                          aria-pressed={verdictOf(f.path) === "keep"} disabled={busy === f.path} onClick={() => judge(f.path, "keep")}>keep</button>
                  <button type="button" class={`small${verdictOf(f.path) === "revert" ? " on" : ""}`}
                          aria-pressed={verdictOf(f.path) === "revert"} disabled={busy === f.path} onClick={() => judge(f.path, "revert")}>revert</button>
                </span>
              </li>
            ))}
          </ul>
          <div class="row">
            <button type="button" onClick={download}>Download patch</button>
            <label class="small"><input type="checkbox" checked={sideBySide} onChange={() => setSideBySide(!sideBySide)} /> side by side</label>
          </div>
          <DiffView diff={diff.diff} sideBySide={sideBySide} label="combined diff" />
        </>
      )}
    </aside>
  );
}
