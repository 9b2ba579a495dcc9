// The REST half of docs/protocol.md. Every request carries the tab's token in the Authorization
// header (never in the URL); every error the server sends has the shape {detail, code, errors} and
// becomes an ApiError whose message is the server's one-line detail.

import { getToken } from "./auth";
import type { BaseEvent } from "./events";

/** Dispatched on window when the server refuses the tab's token (401). */
export const UNAUTHORIZED = "flywheel:unauthorized";

export class ApiError extends Error {
  constructor(readonly status: number, message: string, readonly code: string = "") {
    super(message);
  }
}

export interface Session {
  id: string;
  owner: string;
  status: string;
  title: string;
  source: { kind: string; path?: string; commit?: string; task?: string; approval_mode?: string; [k: string]: unknown };
  workspace_id: string;
  base_snapshot: string;
  policy: Record<string, unknown>;
  created_at: string;
  updated_at: string;
  last_seq: number;
  turns: number;
  output_tokens: number;
  parent_id: string | null;
  branch_step: number | null;
  kind: string;
  rl_run?: string | null;
  rl_iteration?: number | null;
  rl_task?: string | null;
  rl_sample?: number | null;
  rl_reward?: number | null;
  rl_status?: string | null;
  [k: string]: unknown;
}

export interface EventsPage { events: BaseEvent[]; next_after: number; more: boolean }
export interface DiffBody { diff: string; files: { path: string; kind: string }[] }
export interface CallComparison {
  call_id: string; name: string | null; status: "same" | "differs" | "missing" | "extra";
  recorded_ok?: boolean | null; replayed_ok?: boolean | null;
  recorded_output?: string | null; replayed_output?: string | null;
  turn?: number | null; step?: number | null; index?: number | null; args?: Record<string, unknown> | null;
  recorded_duration_ms?: number | null; replayed_duration_ms?: number | null;
  differs_in?: ("ok" | "output" | "edits")[]; recorded_edits?: string[] | null; replayed_edits?: string[] | null;
}
export interface ReexecuteReport {
  session_id: string; counts: Record<"same" | "differs" | "missing" | "extra", number>; calls: CallComparison[];
  reverts?: { turn: number; path: string; ok: boolean; detail: string }[];
}

export interface SnippetSegment { text: string; match: boolean }
export interface BrowsedSession extends Session { match?: { seq: number; type: string; snippet: SnippetSegment[] } | null }
export interface SessionPage { sessions: BrowsedSession[]; next_cursor: string | null }
export interface Facets { owners: string[]; policies: string[]; runs: string[] }
export interface ConversationMessage { role: "system" | "user" | "assistant" | "tool"; content: string; seq: number | null }

export type Query = Record<string, string | number | boolean | null | undefined>;

export function qs(query: Query = {}): string {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(query)) if (v !== undefined && v !== null && v !== "") p.set(k, String(v));
  const s = p.toString();
  return s ? `?${s}` : "";
}

export async function request<T>(method: string, path: string, body?: unknown, token = getToken()): Promise<T> {
  const headers: Record<string, string> = { Accept: "application/json" };
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let res: Response;
  try {
    res = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch {
    throw new ApiError(0, "the server cannot be reached", "unreachable");
  }
  const text = await res.text();
  let data: unknown = undefined;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = text;
    }
  }
  if (!res.ok) {
    // a token revoked (or expired) while the app runs: the shell goes back to the sign-in screen
    if (res.status === 401 && token) window.dispatchEvent(new CustomEvent(UNAUTHORIZED));
    const d = data as { detail?: unknown; code?: string } | undefined;
    const detail = typeof d?.detail === "string" ? d.detail : `${res.status} ${res.statusText}`;
    throw new ApiError(res.status, detail, d?.code ?? "");
  }
  return data as T;
}

export const get = <T>(path: string, query?: Query) => request<T>("GET", path + qs(query));
export const post = <T>(path: string, body?: unknown) => request<T>("POST", path, body ?? {});
export const put = <T>(path: string, body?: unknown) => request<T>("PUT", path, body ?? {});

const s = (id: string) => `/v1/sessions/${encodeURIComponent(id)}`;

export const api = {
  listSessions: (query: Query = {}) => get<Session[]>("/v1/sessions", query),
  session: (id: string) => get<Session>(s(id)),
  createSession: (body: unknown) => post<Session>("/v1/sessions", body),
  events: (id: string, after = 0, limit = 5000) => get<EventsPage>(`${s(id)}/events`, { after, limit }),
  diff: (id: string) => get<DiffBody>(`${s(id)}/diff`),
  send: (id: string, text: string) => post<{ accepted: true }>(`${s(id)}/messages`, { text }),
  interrupt: (id: string) => post<{ interrupted: boolean }>(`${s(id)}/interrupt`),
  reexecute: (id: string) => post<ReexecuteReport>(`${s(id)}/reexecute`),
  branch: (id: string, body: unknown) => post<Session>(`${s(id)}/branch`, body),
  branches: (id: string) => get<Session[]>(`${s(id)}/branches`),
  conversation: (id: string, upto?: number) =>
    get<{ messages: ConversationMessage[]; upto: number }>(`${s(id)}/conversation`, { upto }),
  browse: (query: Query) => get<SessionPage>("/v1/browse/sessions", query),
  facets: () => get<Facets>("/v1/browse/facets"),
};

/** Every event of a session, paged through the log (5,000 per request). */
export async function allEvents(id: string, after = 0): Promise<BaseEvent[]> {
  const out: BaseEvent[] = [];
  for (;;) {
    const page = await api.events(id, after);
    out.push(...page.events);
    after = page.next_after;
    if (!page.more) return out;
  }
}
