// Sign in with an API token (`flywheel token create`, or the staff token `flywheel serve` prints).
// The token is checked against the server, then kept in sessionStorage for this tab only.

import { useState } from "preact/hooks";
import { ApiError } from "../lib/api";
import { clearToken, setToken } from "../lib/auth";
import { type Me, whoAmI } from "../lib/me";

export function SignIn({ onSignedIn, notice }: { onSignedIn: (me: Me) => void; notice?: string }) {
  const [token, setTok] = useState("");
  const [error, setError] = useState(notice ?? "");
  const [busy, setBusy] = useState(false);
  async function submit(e: Event) {
    e.preventDefault();
    const t = token.trim();
    if (!t) {
      setError("Paste a token first.");
      return;
    }
    setBusy(true);
    setError("");
    setToken(t);
    try {
      onSignedIn(await whoAmI());
    } catch (err) {
      clearToken();
      setError(err instanceof ApiError && err.status === 401 ? "That token is not valid (or was revoked)." : String((err as Error).message));
    } finally {
      setBusy(false);
    }
  }
  return (
    <main class="signin" id="main">
      <h1>Flywheel</h1>
      <form onSubmit={submit} aria-label="sign in">
        <label for="token">API token</label>
        <input id="token" type="password" autocomplete="off" spellcheck={false} value={token}
               placeholder="fw_…" onInput={(e) => setTok((e.target as HTMLInputElement).value)} />
        <p class="small muted">
          From <code>flywheel token create --name NAME</code>, or the staff token <code>flywheel serve</code> printed.
          It is kept for this tab only.
        </p>
        <button type="submit" class="primary" disabled={busy}>Sign in</button>
        {error && <p class="error" role="alert">{error}</p>}
      </form>
    </main>
  );
}
