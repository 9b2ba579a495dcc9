// Small display helpers (numbers, times, durations). Everything here returns plain strings:
// rendering them as text is what keeps model and user text inert.

export function duration(ms: number | undefined): string {
  if (ms === undefined || !Number.isFinite(ms)) return "";
  if (ms < 1000) return `${ms < 10 ? ms.toFixed(1) : Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(1)} s`;
  return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
}

export function when(iso: string | undefined): string {
  if (!iso) return "";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString();
}

export function num(x: number | null | undefined, digits = 3): string {
  if (x === null || x === undefined || !Number.isFinite(x)) return "—";
  return Number.isInteger(x) ? String(x) : x.toFixed(digits);
}

export function shortId(id: string): string {
  return id.length > 10 ? id.slice(0, 8) : id;
}

/** A one-line summary of a call's arguments, for its card header. */
export function argSummary(args: Record<string, unknown>): string {
  for (const key of ["command", "path", "pattern", "query"]) {
    const v = args[key];
    if (typeof v === "string" && v) return v.length > 120 ? `${v.slice(0, 117)}…` : v;
  }
  const s = JSON.stringify(args);
  return s === "{}" ? "" : s.length > 120 ? `${s.slice(0, 117)}…` : s;
}
