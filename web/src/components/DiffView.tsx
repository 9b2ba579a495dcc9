// A unified diff drawn by diff2html, syntax-highlighted by highlight.js (both escape the text they
// draw). Redrawn only when the diff text or the layout changes.

import { Diff2HtmlUI } from "diff2html/lib-esm/ui/js/diff2html-ui-base";
import "diff2html/bundles/css/diff2html.min.css";
import { useEffect, useRef } from "preact/hooks";
import { hljs } from "../lib/highlight";

export function DiffView({ diff, sideBySide = false, label }: { diff: string; sideBySide?: boolean; label?: string }) {
  const ref = useRef<HTMLDivElement>(null);
  useEffect(() => {
    const el = ref.current;
    if (!el) return;
    if (!diff.trim()) {
      el.textContent = "(no changes)";
      return;
    }
    const ui = new Diff2HtmlUI(el, diff, {
      drawFileList: false, matching: "lines", outputFormat: sideBySide ? "side-by-side" : "line-by-line",
      highlight: true, fileContentToggle: false, stickyFileHeaders: false, synchronisedScroll: true,
      colorScheme: "light" as never,
    }, hljs as never);
    ui.draw();
  }, [diff, sideBySide]);
  return <div class="diff" ref={ref} role="region" aria-label={label ?? "diff"} />;
}
