// Replay's time axis: each tool call as an interval (dispatched -> result), each model step as an
// interval (first text -> its assistant_message), lanes assigned so that calls that overlap in time
// (parallel calls) sit on different rows. Times are seconds since the session's first event (`t`).

import type { BaseEvent } from "./events";
import { callId } from "./events";

export interface Bar {
  id: string;
  kind: "call" | "model";
  label: string;
  turn: number;
  step: number;
  start: number;
  end: number;
  /** index in the event list of the event that opens / closes the bar */
  startIndex: number;
  endIndex: number;
  ok?: boolean;
  lane: number;
}

export interface Axis {
  bars: Bar[];
  lanes: number;
  duration: number;
  /** `t` of each event (its position on the axis) */
  times: number[];
}

export function buildAxis(events: readonly BaseEvent[]): Axis {
  const t0 = events.length ? events[0].ts : 0;
  const times = events.map((e) => e.t ?? e.ts - t0);
  const calls = new Map<string, Bar>();
  const models = new Map<string, Bar>();
  events.forEach((e, i) => {
    const t = times[i];
    const step = (e.step as number | undefined) ?? 0;
    if (e.type === "assistant_delta" || e.type === "tool_call_delta" || e.type === "assistant_message") {
      const key = `t${e.turn}s${step}`;
      let bar = models.get(key);
      if (!bar) {
        bar = { id: key, kind: "model", label: `model step ${step}`, turn: e.turn, step, start: t, end: t,
                startIndex: i, endIndex: i, lane: 0 };
        models.set(key, bar);
      }
      bar.end = t;
      bar.endIndex = i;
    }
    if (e.type === "tool_call_started" || e.type === "tool_call_running" || e.type === "tool_result") {
      const id = (e.call_id as string | undefined) ?? callId(e.turn, step, (e.index as number) ?? 0);
      let bar = calls.get(id);
      if (!bar) {
        bar = { id, kind: "call", label: String(e.name ?? "?"), turn: e.turn, step, start: t, end: t,
                startIndex: i, endIndex: i, lane: 0 };
        calls.set(id, bar);
      }
      if (e.type === "tool_call_running") bar.start = t; // it waited (queued / approval) until here
      if (e.type === "tool_result") {
        bar.end = t;
        bar.endIndex = i;
        bar.ok = e.ok as boolean;
        if (e.name) bar.label = String(e.name);
      }
    }
  });
  const duration = times.length ? times[times.length - 1] : 0;
  for (const bar of calls.values()) if (bar.endIndex === bar.startIndex) bar.end = duration; // never finished
  const callBars = [...calls.values()].sort((a, b) => a.start - b.start || a.startIndex - b.startIndex);
  const lanes = assignLanes(callBars);
  return { bars: [...models.values(), ...callBars], lanes, duration, times };
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
