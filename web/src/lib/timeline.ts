// Replay's time axis. The bars come from the same fold of the events that draws the transcript
// (lib/transcript.ts: when each call was dispatched, started running and ended), plus each model
// step (asked after the event before its first one, answered by its assistant_message), the
// definitions GET /v1/sessions/{id}/calls uses too. Folding the events the view already holds
// (instead of asking /calls as well) halves what the server does to open a long recording.
// Lanes put calls that overlap in time (parallel calls) on different rows. Times are seconds since
// the session's first event.

import type { BaseEvent } from "./events";
import type { Transcript } from "./transcript";

export interface Bar {
  id: string;
  kind: "call" | "model";
  label: string;
  turn: number;
  step: number;
  start: number;
  end: number;
  ok?: boolean | null;
  lane: number;
}

export interface Axis {
  bars: Bar[];
  lanes: number;
  duration: number;
  /** `t` of each event (its position on the axis) */
  times: number[];
}

export function buildAxis(events: readonly BaseEvent[], full: Transcript): Axis {
  const t0 = events.length ? events[0].ts : 0;
  const times = events.map((e) => e.ts - t0);
  const duration = times.length ? times[times.length - 1] : 0;
  const models: Bar[] = [];
  const asked = new Map<string, number>();
  events.forEach((e, i) => {
    const key = `t${e.turn}s${String(e.step)}`;
    if (typeof e.step === "number" && !asked.has(key)) asked.set(key, i > 0 ? times[i - 1] : 0);
    if (e.type === "assistant_message") {
      models.push({ id: key, kind: "model", label: `model step ${String(e.step)}`, turn: e.turn, step: e.step as number,
                    start: asked.get(key) ?? times[i], end: times[i], lane: 0 });
    }
  });
  const calls: Bar[] = [...full.calls.values()].filter((c) => c.parsedTs !== undefined).map((c) => ({
    id: c.id, kind: "call", label: c.name ?? "?", turn: c.turn, step: c.step,
    start: (c.runTs ?? c.parsedTs!) - t0, end: c.endTs !== undefined ? c.endTs - t0 : duration, ok: c.ok, lane: 0,
  }));
  calls.sort((a, b) => a.start - b.start);
  const lanes = assignLanes(calls);
  return { bars: [...models, ...calls], lanes, duration, times };
}

/** Greedy interval colouring: each bar takes the first lane free at its start. Returns the lane count. */
export function assignLanes(bars: Bar[]): number {
  const laneEnds: number[] = [];
  for (const bar of bars) {
    let lane = laneEnds.findIndex((end) => end <= bar.start);
    if (lane < 0) {
      lane = laneEnds.length;
      laneEnds.push(bar.end);
    } else laneEnds[lane] = bar.end;
    bar.lane = lane;
  }
  return laneEnds.length;
}

/** The index of the last event at or before time `t` (-1 if none). */
export function indexAt(times: readonly number[], t: number): number {
  let lo = 0;
  let hi = times.length - 1;
  let best = -1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (times[mid] <= t) {
      best = mid;
      lo = mid + 1;
    } else hi = mid - 1;
  }
  return best;
}
