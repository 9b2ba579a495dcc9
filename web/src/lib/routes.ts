// Which optional API routes this server has, read once from its public schema (/openapi.json), so
// the app uses a route only where the server offers it instead of probing (and logging 404s).

import { get } from "./api";

let paths: Promise<Set<string>> | null = null;

export function serverPaths(): Promise<Set<string>> {
  paths ??= get<{ paths?: Record<string, unknown> }>("/openapi.json").then(
    (schema) => new Set(Object.keys(schema.paths ?? {})), () => new Set<string>());
  return paths;
}

/** Whether the server documents `path` (as written in its schema, e.g. "/v1/sessions/{session_id}/feedback"). */
export async function hasRoute(path: string): Promise<boolean> {
  return (await serverPaths()).has(path);
}
