// Feedback on a session: thumbs up/down (and a comment) on a turn, keep/revert on a changed file.
// Stored by the server in the session log (docs/protocol.md, "Feedback"), shown again in replay.

import { post } from "./api";

export interface FeedbackItem {
  id?: number;
  turn?: number | null;
  path?: string | null;
  rating?: "up" | "down" | null;
  verdict?: "keep" | "revert" | null;
  comment?: string;
  author?: string;
  created_at?: string;
  /** for a revert: what it changed in the workspace */
  diff?: string;
  [k: string]: unknown;
}

const f = (id: string) => `/v1/sessions/${encodeURIComponent(id)}/feedback`;

export const feedback = {
  rateTurn: (id: string, turn: number, rating: "up" | "down", comment: string) =>
    post<FeedbackItem>(f(id), { turn, rating, comment }),
  judgeFile: (id: string, path: string, verdict: "keep" | "revert") => post<FeedbackItem>(f(id), { path, verdict }),
};
