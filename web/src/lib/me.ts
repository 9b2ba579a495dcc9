// Who the tab's token belongs to (`GET /v1/me`): the app shows the staff screens to staff.
// The server refuses staff routes to users whatever the app shows.

import { get } from "./api";

export interface Me { name: string; role: "user" | "staff"; is_staff: boolean }

export const whoAmI = () => get<Me>("/v1/me");
