// Hash routes (#/chat/ID, #/replay/ID, #/sessions?…, #/runs/ID?iteration=3): the server serves one
// page at /, and nothing secret ever goes into them (the token stays in sessionStorage).

import { useEffect, useState } from "preact/hooks";

export interface Route {
  /** path segments after "#/", e.g. ["chat", "abc"] */
  parts: string[];
  query: URLSearchParams;
}

export function parseHash(hash: string): Route {
  const body = hash.replace(/^#\/?/, "");
  const [path, query = ""] = body.split("?", 2);
  return { parts: path.split("/").filter(Boolean).map(decodeURIComponent), query: new URLSearchParams(query) };
}

export function href(parts: (string | number)[], query: Record<string, string | number | undefined> = {}): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(query)) if (v !== undefined && v !== "") q.set(k, String(v));
  const qs = q.toString();
  return `#/${parts.map((p) => encodeURIComponent(String(p))).join("/")}${qs ? `?${qs}` : ""}`;
}

export function navigate(parts: (string | number)[], query: Record<string, string | number | undefined> = {}): void {
  location.hash = href(parts, query);
}

export function useRoute(): Route {
  const [route, setRoute] = useState(() => parseHash(location.hash));
  useEffect(() => {
    const on = () => setRoute(parseHash(location.hash));
    window.addEventListener("hashchange", on);
    return () => window.removeEventListener("hashchange", on);
  }, []);
  return route;
}
