// The app shell: sign-in, the navigation, and the hash routes. The RL link is shown to staff only;
// the server refuses staff routes to users whatever the app shows (the screens display its 403).
// Users browse and replay their own sessions; staff browse and replay everyone's.

import { render } from "preact";
import { useEffect, useState } from "preact/hooks";
import { Chat } from "./components/Chat";
import { ChatHome } from "./components/ChatHome";
import { Problem } from "./components/Refused";
import { lazyScreen } from "./components/Lazy";
import { SignIn } from "./components/SignIn";
import { ApiError, UNAUTHORIZED } from "./lib/api";
import { clearToken, getToken } from "./lib/auth";
import { type Me, whoAmI } from "./lib/me";
import { href, type Route, useRoute } from "./lib/route";
import "./highlight-theme.css";
import "./styles.css";

const Replay = lazyScreen(() => import("./components/Replay").then((m) => m.Replay));
const SessionBrowser = lazyScreen(() => import("./components/SessionBrowser").then((m) => m.SessionBrowser));
const RunList = lazyScreen(() => import("./components/RlRuns").then((m) => m.RunList));
const RunView = lazyScreen(() => import("./components/RlRuns").then((m) => m.RunView));

function App() {
  const route = useRoute();
  const [me, setMe] = useState<Me | null>(null);
  const [checking, setChecking] = useState(() => getToken() !== null);
  const [notice, setNotice] = useState("");

  useEffect(() => {
    const signedOut = () => {
      clearToken();
      setMe(null);
      setNotice("The server no longer accepts your token (revoked?); sign in again.");
    };
    window.addEventListener(UNAUTHORIZED, signedOut);
    return () => window.removeEventListener(UNAUTHORIZED, signedOut);
  }, []);

  useEffect(() => {
    if (!getToken()) return;
    whoAmI().then(setMe, (err) => {
      clearToken();
      setNotice(err instanceof ApiError && err.status === 401 ? "Your token is no longer valid; sign in again." : String(err.message));
    }).finally(() => setChecking(false));
  }, []);

  if (checking) return <main id="main" class="page"><p class="muted">Signing in…</p></main>;
  if (!me) return <SignIn onSignedIn={setMe} notice={notice} />;

  const signOut = () => {
    clearToken();
    setMe(null);
    location.hash = "#/";
  };
  const section = route.parts[0] ?? "chat";
  return (
    <>
      <a href="#main" class="skip">Skip to content</a>
      <nav class="top" aria-label="main">
        <span class="brand">Flywheel</span>
        <a href={href(["chat"])} aria-current={section === "chat" ? "page" : undefined}>Chat</a>
        <a href={href(["sessions"])} aria-current={section === "sessions" || section === "replay" ? "page" : undefined}>Sessions</a>
        {me.role === "staff" && <a href={href(["runs"])} aria-current={section === "runs" ? "page" : undefined}>RL runs</a>}
        <span class="spacer" />
        <span class="small muted">{me.name ? `${me.name} · ` : ""}{me.role}</span>
        <button type="button" class="small" onClick={signOut}>Sign out</button>
      </nav>
      <Screen route={route} me={me} />
    </>
  );
}

function Screen({ route, me }: { route: Route; me: Me }) {
  const [section, id] = route.parts;
  switch (section ?? "chat") {
    case "chat":
      return id ? <Chat id={id} key={id} me={me.name} /> : <ChatHome me={me} />;
    case "sessions":
      return <SessionBrowser query={route.query} />;
    case "replay":
      return id ? <Replay id={id} key={id} /> : null;
    case "runs":
      return id ? <RunView id={id} key={id} iteration={route.query.get("iteration")} /> : <RunList />;
    default:
      return <main id="main" class="page"><Problem error={new ApiError(404, `no screen ${location.hash}`)} /></main>;
  }
}

render(<App />, document.getElementById("app")!);
