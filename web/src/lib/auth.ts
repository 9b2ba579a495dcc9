// The API token for this tab: sessionStorage only (gone when the tab closes), never in a URL,
// never in localStorage or a cookie. Not guaranteed: that other scripts on the same origin cannot
// read it (the server's Content-Security-Policy allows only this app's own scripts).

const KEY = "flywheel.token";

export function getToken(): string | null {
  try {
    return sessionStorage.getItem(KEY);
  } catch {
    return null;
  }
}

export function setToken(token: string): void {
  sessionStorage.setItem(KEY, token);
}

export function clearToken(): void {
  sessionStorage.removeItem(KEY);
}
