// A live timer for a running call: seconds since `from` (server time), ticking every 100 ms until
// `until` is set; then the final figure.

import { useEffect, useState } from "preact/hooks";
import { serverNow } from "../lib/clock";
import { duration } from "../lib/format";

export function Elapsed({ from, until, frozenAt }: { from?: number; until?: number; frozenAt?: number }) {
  const [, tick] = useState(0);
  const live = from !== undefined && until === undefined && frozenAt === undefined;
  useEffect(() => {
    if (!live) return;
    const id = window.setInterval(() => tick((n) => n + 1), 100);
    return () => window.clearInterval(id);
  }, [live]);
  if (from === undefined) return null;
  const end = until ?? frozenAt ?? serverNow();
  return <span class="elapsed" aria-label="elapsed">{duration(Math.max(0, (end - from) * 1000))}</span>;
}
