// The server's clock as this tab sees it: events carry server time (`ts`), timers run on the tab's
// clock, so live timers subtract the smallest (receive time - ts) seen on live events.
// Not guaranteed: exact for a tab whose clock jumps; the timer is for watching, `duration_ms` is the truth.

let skew: number | null = null;

export function observeLive(ts: number): void {
  const d = Date.now() / 1000 - ts;
  if (skew === null || d < skew) skew = d;
}

/** Now, in server seconds. */
export function serverNow(): number {
  return Date.now() / 1000 - (skew ?? 0);
}
