// One RL curve panel drawn by uPlot: x = iteration, one line per metric key. Clicking the plot picks
// the nearest iteration (the rollouts behind that point open below); the picked iteration is marked
// with a vertical line. uPlot draws on a canvas, so the panel also lists its values in a table that
// screen readers and keyboards can use.

import { useEffect, useRef } from "preact/hooks";
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";
import { num } from "../lib/format";

const COLORS = ["#1f4fb5", "#b3261e", "#2b7a3d", "#8a4b00", "#6a1b9a", "#00578a"];

export interface ChartProps {
  title: string;
  iterations: number[];
  series: Record<string, (number | null)[]>;
  keys: string[];
  selected?: number;
  onPick: (iteration: number) => void;
}

export function Chart({ title, iterations, series, keys, selected, onPick }: ChartProps) {
  const box = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  const picked = useRef<number | undefined>(selected);
  const pick = useRef(onPick);
  pick.current = onPick;
  picked.current = selected;

  useEffect(() => {
    const el = box.current;
    if (!el) return;
    const data: uPlot.AlignedData = [iterations, ...keys.map((k) => series[k] ?? [])];
    const u = new uPlot({
      width: Math.max(280, el.clientWidth || 320), height: 180,
      scales: { x: { time: false } },
      axes: [{ label: "iteration", stroke: "#57606a", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000] },
             { stroke: "#57606a", size: 50 }],
      series: [{ label: "iteration" }, ...keys.map((k, i) => ({
        label: k, stroke: COLORS[i % COLORS.length], width: 2, spanGaps: true, points: { size: 6 },
      }))],
      cursor: { drag: { x: false, y: false } },
      legend: { show: false },
      hooks: {
        ready: [(self) => {
          self.over.addEventListener("click", () => {
            const idx = self.cursor.idx;
            if (idx !== null && idx !== undefined) pick.current(iterations[idx]);
          });
        }],
        draw: [(self) => {
          if (picked.current === undefined) return;
          const x = self.valToPos(picked.current, "x", true);
          const ctx = self.ctx;
          ctx.save();
          ctx.strokeStyle = "#b3261e";
          ctx.lineWidth = 2;
          ctx.beginPath();
          ctx.moveTo(x, self.bbox.top);
          ctx.lineTo(x, self.bbox.top + self.bbox.height);
          ctx.stroke();
          ctx.restore();
        }],
      },
    }, data, el);
    plot.current = u;
    return () => {
      u.destroy();
      plot.current = null;
    };
  }, [iterations, series, keys.join(",")]);

  useEffect(() => plot.current?.redraw(false), [selected]);

  return (
    <figure class="chart" aria-label={`${title} per iteration`}>
      <h2>{title}</h2>
      <div ref={box} class="chart-plot" data-keys={keys.join(",")} />
      <details>
        <summary class="small">values</summary>
        <table class="grid small">
          <thead><tr><th scope="col">iteration</th>{keys.map((k) => <th key={k} scope="col">{k}</th>)}</tr></thead>
          <tbody>
            {iterations.map((it, i) => (
              <tr key={it}>
                <td><button type="button" class="linkish" onClick={() => onPick(it)}>{it}</button></td>
                {keys.map((k) => <td key={k}>{num(series[k]?.[i])}</td>)}
              </tr>
            ))}
          </tbody>
        </table>
      </details>
    </figure>
  );
}
