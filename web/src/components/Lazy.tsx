// A screen loaded on first use (its own script file, fetched from this server), so the first load
// of the app carries only the sign-in and chat code.

import type { ComponentType } from "preact";
import { useEffect, useState } from "preact/hooks";
import { Problem } from "./Refused";

export function lazyScreen<P extends object>(load: () => Promise<ComponentType<P>>): ComponentType<P> {
  let cached: ComponentType<P> | null = null;
  return function LazyScreen(props: P) {
    const [Comp, setComp] = useState<ComponentType<P> | null>(() => cached);
    const [error, setError] = useState<unknown>(null);
    useEffect(() => {
      if (cached) return;
      load().then((c) => { cached = c; setComp(() => c); }, setError);
    }, []);
    if (error) return <main id="main" class="page"><Problem error={error} /></main>;
    if (!Comp) return <main id="main" class="page"><p class="muted">Loading…</p></main>;
    return <Comp {...props} />;
  };
}
