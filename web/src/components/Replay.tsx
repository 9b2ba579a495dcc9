// Replay for support staff (and a session's owner): the recorded events on a time axis with
// play/pause, step and a scrubber; the conversation (as shown, or as the model saw it) at that point;
// a call's details on click; feedback given on the session; re-execute and branch.

import { useEffect, useMemo, useRef, useState } from "preact/hooks";
import { allEvents, api, type Session } from "../lib/api";
import type { BaseEvent } from "../lib/events";
import { num, when } from "../lib/format";
import { href } from "../lib/route";
import { buildAxis, indexAt } from "../lib/timeline";
import { fold, type Transcript } from "../lib/transcript";
import { Branch, Lineage } from "./Branch";
import { CallDetails } from "./CallDetails";
import { Icon } from "./Icon";
import { ModelView } from "./ModelView";
import { Reexecute } from "./Reexecute";
import { Problem } from "./Refused";
import { TimelineChart } from "./TimelineChart";
import { TranscriptView } from "./TranscriptView";

const SPEEDS = [0.5, 1, 2, 5, 20];

export function Replay({ id }: { id: string }) {
  const [session, setSession] = useState<Session | null>(null);
  const [events, setEvents] = useState<BaseEvent[] | null>(null);
  const [error, setError] = useState<unknown>(null);
  const [pos, setPos] = useState(0); // events applied: 0..events.length
  const [playing, setPlaying] = useState(false);
  const [speed, setSpeed] = useState(2);
  const [selected, setSelected] = useState<string | undefined>();
  const [view, setView] = useState<"transcript" | "model">("transcript");

  useEffect(() => {
    // the log in pages of 5,000 (lighter for the server than /timeline; times are taken from `ts`)
    Promise.all([api.session(id), allEvents(id)]).then(([s, ev]) => {
      setSession(s);
      setEvents(ev);
      setPos(ev.length);
    }, setError);
  }, [id]);

  const axis = useMemo(() => buildAxis(events ?? [], fold(events ?? [])), [events]);
  const transcript = useIncrementalFold(events ?? [], pos);
  const at = pos > 0 ? axis.times[pos - 1] : 0; // seconds since the first event
  const steps = useMemo(() => (events ?? []).filter((e) => e.type === "assistant_message").length, [events]);
  const stepsSoFar = useMemo(() => (events ?? []).slice(0, pos).filter((e) => e.type === "assistant_message").length, [events, pos]);
  usePlayback(playing, speed, axis.times, pos, setPos, () => setPlaying(false));

  if (error) return <main id="main" class="page"><Problem error={error} /></main>;
  if (!events || !session) return <main id="main" class="page"><p class="muted">Loading the recording…</p></main>;
  const n = events.length;
  const call = selected ? transcript.calls.get(selected) : undefined;
  const go = (p: number) => { setPlaying(false); setPos(Math.max(0, Math.min(n, p))); };
  const stepEdges = events.map((e, i) => (e.type === "assistant_message" ? i + 1 : -1)).filter((i) => i > 0);

  return (
    <main id="main" class="page replay">
      <header class="replay-head">
        <h1>Replay: {session.title || session.id}</h1>
        <p class="small muted">
          {session.kind === "rl" ? `RL rollout · run ${session.rl_run} · iteration ${session.rl_iteration} · task ${session.rl_task} · reward ${num(session.rl_reward)}` : `user session · ${session.owner}`}
          {" · "}{String(session.policy.kind ?? "")}{session.policy.model ? ` ${String(session.policy.model)}` : ""}
          {" · "}{when(session.created_at)} · {n} events · {steps} model steps
          {session.kind !== "rl" && <> · <a href={href(["chat", session.id])}>open in chat</a></>}
        </p>
        <Lineage session={session} />
      </header>
      <div class="controls" role="toolbar" aria-label="replay controls">
        <button type="button" onClick={() => go(0)} aria-label="to the start"><Icon name="first" /></button>
        <button type="button" onClick={() => go([...stepEdges].reverse().find((i) => i < pos) ?? 0)} aria-label="previous model step"><Icon name="prevStep" /></button>
        <button type="button" onClick={() => go(pos - 1)} aria-label="step back"><Icon name="back" /></button>
        <button type="button" class="primary" onClick={() => { if (pos >= n) setPos(0); setPlaying(!playing); }}
                aria-label={playing ? "pause" : "play"}><Icon name={playing ? "pause" : "play"} /></button>
        <button type="button" onClick={() => go(pos + 1)} aria-label="step forward"><Icon name="forward" /></button>
        <button type="button" onClick={() => go(stepEdges.find((i) => i > pos) ?? n)} aria-label="next model step"><Icon name="nextStep" /></button>
        <button type="button" onClick={() => go(n)} aria-label="to the end"><Icon name="last" /></button>
        <label class="small" for="speed">speed</label>
        <select id="speed" value={speed} onChange={(e) => setSpeed(Number((e.target as HTMLSelectElement).value))}>
          {SPEEDS.map((s) => <option key={s} value={s}>{s}×</option>)}
        </select>
        <label for="scrubber" class="visually-hidden">position in the recording</label>
        <input id="scrubber" type="range" min={0} max={n} value={pos} class="scrubber"
               aria-valuetext={`event ${pos} of ${n}, ${at.toFixed(2)} s`}
               onInput={(e) => go(Number((e.target as HTMLInputElement).value))} />
        <span class="small position" aria-live="off">event {pos}/{n} · {at.toFixed(2)} s · step {stepsSoFar}</span>
      </div>
      <TimelineChart axis={axis} at={at} selected={selected} onSelect={(bar) => setSelected(bar.id)} />
      <div class="replay-body">
        <section class="panel conversation" aria-labelledby="conv-h">
          <div class="row">
            <h2 id="conv-h">Conversation</h2>
            <span class="spacer" />
            <div role="radiogroup" aria-label="how to show the conversation" class="row">
              <label class="small"><input type="radio" name="view" checked={view === "transcript"} onChange={() => setView("transcript")} /> as shown</label>
              <label class="small"><input type="radio" name="view" checked={view === "model"} onChange={() => setView("model")} /> as the model saw it</label>
            </div>
          </div>
          {view === "transcript" ? (
            <TranscriptView transcript={transcript} version={transcript.version} frozenAt={events[pos - 1]?.ts}
                            onSelect={(c) => setSelected(c.id)} selectedCall={selected} />
          ) : (
            <ModelView sessionId={id} upto={events[pos - 1]?.seq ?? 0} />
          )}
        </section>
        <div class="side">
          {call ? <CallDetails call={call} onClose={() => setSelected(undefined)} /> : selected ? (
            <p class="panel muted">That call has not started at this point of the replay.</p>
          ) : null}
          <FeedbackList transcript={transcript} />
          <Reexecute sessionId={id} />
          <Branch session={session} step={stepsSoFar} steps={steps} />
        </div>
      </div>
    </main>
  );
}

/** fold(events[0:pos]), applying only the new events when the position moves forward. */
function useIncrementalFold(events: BaseEvent[], pos: number): Transcript {
  const ref = useRef<{ events: BaseEvent[]; pos: number; t: Transcript } | null>(null);
  const cur = ref.current;
  if (!cur || cur.events !== events || pos < cur.pos) {
    ref.current = { events, pos, t: fold(events.slice(0, pos)) };
  } else if (pos > cur.pos) {
    cur.t.applyAll(events.slice(cur.pos, pos));
    cur.pos = pos;
  }
  return ref.current!.t;
}

/** While playing, move through the events at `speed`× their recorded pace (idle gaps over 1 s skipped). */
function usePlayback(playing: boolean, speed: number, times: number[], pos: number, setPos: (p: number) => void, stop: () => void) {
  const clock = useRef({ t: 0, pos: -1 });
  useEffect(() => {
    if (!playing) return;
    let frame = 0;
    let last = performance.now();
    if (clock.current.pos !== pos) clock.current = { t: pos > 0 ? times[pos - 1] : (times[0] ?? 0), pos };
    const tick = (now: number) => {
      const dt = ((now - last) / 1000) * speed;
      last = now;
      const c = clock.current;
      const next = times[c.pos];
      if (next === undefined) return stop();
      c.t = next - c.t > 1 ? next - 0.05 : c.t + dt;
      const p = indexAt(times, c.t) + 1;
      if (p !== c.pos) {
        c.pos = p;
        setPos(p);
      }
      frame = requestAnimationFrame(tick);
    };
    frame = requestAnimationFrame(tick);
    return () => cancelAnimationFrame(frame);
  }, [playing, speed, times]);
}

/** Every piece of feedback given up to the replay's position (ratings per turn, file verdicts). */
function FeedbackList({ transcript }: { transcript: Transcript }) {
  const ratings = transcript.turns.flatMap((t) => [...t.ratings.values()]);
  const files = [...transcript.verdicts.values()];
  if (!ratings.length && !files.length) return null;
  return (
    <section class="panel" aria-labelledby="fb-h">
      <h2 id="fb-h">Feedback so far</h2>
      <ul class="small feedback-list">
        {ratings.map((f) => (
          <li key={f.seq}><Icon name={f.rating === "up" ? "up" : "down"} /> turn {f.of_turn}: {f.by} rated it {f.rating === "up" ? "good" : "bad"}{f.comment ? ` “${f.comment}”` : ""}</li>
        ))}
        {files.map((f) => <li key={f.seq}><code>{f.path}</code>: {f.by} {f.verdict === "revert" ? "reverted it" : "kept it"}</li>)}
      </ul>
    </section>
  );
}
