import type { XKind } from "./chartState";
import { fmtNum, fmtSeconds } from "./format";

/** The run's steps with their wall time and tokens trained (GET /api/runs/{id}/metrics/axes). */
export type StepAxes = { step: number[]; wall_s: (number | null)[]; tokens: number[] };

/** A step's position on the `kind` axis: linear between the nearest known steps of `axes`; null outside them (or
 * where the wall time is not known). */
export function stepTo(kind: XKind, axes: StepAxes | null): (step: number) => number | null {
  if (kind === "step") return (s) => s;
  if (!axes || axes.step.length === 0) return () => null;
  const ys = kind === "time" ? axes.wall_s : axes.tokens;
  const xs = axes.step;
  return (s) => {
    if (s < xs[0] || s > xs[xs.length - 1]) return null;
    let lo = 0, hi = xs.length - 1;
    while (hi - lo > 1) {
      const mid = (lo + hi) >> 1;
      if (xs[mid] <= s) lo = mid; else hi = mid;
    }
    const [a, b] = [ys[lo], ys[hi]];
    if (a === null || b === null) return null;
    if (xs[hi] === xs[lo]) return a;
    return a + ((b - a) * (s - xs[lo])) / (xs[hi] - xs[lo]);
  };
}

/** Series drawn by step, moved to another x axis: points with no position there are dropped, and x stays
 * non-decreasing (a resumed attempt's later clock never draws a line backwards). */
export function remap<L extends { values: (number | null)[] }>(x: number[], lines: L[], to: (step: number) => number | null): { x: number[]; lines: L[] } {
  const keep: number[] = [];
  const out: number[] = [];
  let last = -Infinity;
  x.forEach((s, i) => {
    const v = to(s);
    if (v === null) return;
    last = Math.max(last, v);
    keep.push(i);
    out.push(last);
  });
  return { x: out, lines: lines.map((l) => ({ ...l, values: keep.map((i) => l.values[i]) })) };
}

/** The x axis's label and tick formatter. */
export const X_AXES: Record<XKind, { label: string; format?: (v: number) => string }> = {
  step: { label: "step" },
  time: { label: "wall time", format: (v) => fmtSeconds(v) },
  tokens: { label: "tokens", format: (v) => fmtNum(v, v >= 1e6 ? 2 : 1) },
};
