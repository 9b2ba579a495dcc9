// Who the tab's token belongs to. `GET /v1/me` answers directly; a server without that route is asked
// the documented way instead: listing another owner's sessions is refused (403) to users only.

import { ApiError, get } from "./api";

export interface Me { name: string; role: "user" | "staff" }

export async function whoAmI(): Promise<Me> {
  try {
    return await get<Me>("/v1/me");
  } catch (err) {
    if (!(err instanceof ApiError) || err.status !== 404) throw err;
  }
  try {
    await get("/v1/sessions", { owner: "flywheel-role-probe", limit: 1 });
    return { name: "", role: "staff" };
  } catch (err) {
    if (err instanceof ApiError && err.status === 403) return { name: "", role: "user" };
    throw err;
  }
}
