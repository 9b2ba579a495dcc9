// The replay's time axis: model steps on the top row, tool calls below, one row per lane so calls
// that ran at the same time (parallel calls) overlap on the axis and stack on separate rows. Each bar
// is a button (keyboard reachable): it selects the call. The cursor marks the replay's position.

import type { Axis, Bar } from "../lib/timeline";
import { duration } from "../lib/format";

const ROW = 22;

export function TimelineChart({ axis, at, selected, onSelect }: {
  axis: Axis; at: number; selected?: string; onSelect: (bar: Bar) => void;
}) {
  const span = axis.duration > 0 ? axis.duration : 1;
  const pct = (t: number) => `${Math.min(100, Math.max(0, (t / span) * 100))}%`;
  const height = (axis.lanes + 1) * ROW + 18;
  const ticks = niceTicks(span);
  return (
    <div class="timeline" role="group" aria-label="timeline of model steps and tool calls">
      <div class="timeline-plot" style={{ height: `${height}px` }}>
        {ticks.map((t) => (
          <div key={t} class="tick" style={{ left: pct(t) }} aria-hidden="true"><span>{fmtTick(t)}</span></div>
        ))}
        {axis.bars.map((bar) => {
          const top = bar.kind === "model" ? 0 : (bar.lane + 1) * ROW;
          const w = Math.max(((bar.end - bar.start) / span) * 100, 0.4);
          const label = `${bar.kind === "model" ? bar.label : `${bar.label} ${bar.id}`}, ${duration((bar.end - bar.start) * 1000)}`;
          if (bar.kind === "model") {
            return <div key={bar.id} class="bar model" style={{ left: pct(bar.start), width: `${w}%`, top: `${top}px` }}
                        title={label} aria-hidden="true" />;
          }
          return (
            <button key={bar.id} type="button" title={label} aria-label={label} aria-pressed={selected === bar.id}
                    class={`bar call${bar.ok === false ? " failed" : ""}${selected === bar.id ? " selected" : ""}`}
                    style={{ left: pct(bar.start), width: `${w}%`, top: `${top}px` }}
                    onClick={() => onSelect(bar)} data-call-id={bar.id}>
              <span class="bar-label" aria-hidden="true">{bar.label}</span>
            </button>
          );
        })}
        <div class="cursor" style={{ left: pct(at) }} aria-hidden="true" />
      </div>
    </div>
  );
}

function niceTicks(span: number): number[] {
  const raw = span / 6;
  const mag = 10 ** Math.floor(Math.log10(raw || 1));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) ?? raw;
  const out: number[] = [];
  for (let t = 0; t <= span + 1e-9; t += step) out.push(Number(t.toFixed(6)));
  return out;
}

function fmtTick(t: number): string {
  return t >= 60 ? `${Math.floor(t / 60)}m${Math.round(t % 60)}s` : `${Number(t.toPrecision(3))} s`;
}
