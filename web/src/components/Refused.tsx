// What a screen shows when the server refuses it (403 for a user on a staff route, 404, …).

import { ApiError } from "../lib/api";

export function Problem({ error }: { error: unknown }) {
  if (!error) return null;
  const status = error instanceof ApiError ? error.status : 0;
  const message = error instanceof Error ? error.message : String(error);
  return (
    <div class="problem" role="alert">
      <strong>{status === 403 ? "Refused by the server" : status === 404 ? "Not found" : "Error"}</strong>
      {status ? ` (${status})` : ""}: {message}
    </div>
  );
}
