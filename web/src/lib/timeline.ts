// Replay's time axis, drawn from the server's call timings (GET /v1/sessions/{id}/calls: when each
// tool call was dispatched, started running and ended; when each model step was asked and answered).
// The app only lays the bars out: lanes so that calls which overlap in time (parallel calls) sit on
// different rows. Times are seconds since the session's first event, as the timeline's `t`.

import type { CallsBody } from "./api";
import type { BaseEvent } from "./events";

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

export function buildAxis(events: readonly BaseEvent[], timings: CallsBody | null): Axis {
  const t0 = events.length ? events[0].ts : 0;
  const times = events.map((e) => e.t ?? e.ts - t0);
  const duration = times.length ? times[times.length - 1] : 0;
  const models: Bar[] = (timings?.steps ?? []).map((s) => ({
    id: `t${s.turn}s${s.step}`, kind: "model", label: `model step ${s.step}`, turn: s.turn, step: s.step,
    start: s.started_t, end: s.ended_t ?? duration, lane: 0,
  }));
  const calls: Bar[] = (timings?.calls ?? []).map((c) => ({
    id: c.call_id, kind: "call", label: c.name ?? "?", turn: c.turn, step: c.step,
    start: c.running_t ?? c.started_t, end: c.ended_t ?? duration, ok: c.ok, lane: 0,
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
