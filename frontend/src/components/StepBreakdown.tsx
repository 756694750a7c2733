import { useMemo } from "react";
import type { Run } from "../lib/api";
import { fmtSeconds } from "../lib/format";
import type { Store } from "../pages/run/useRunData";
import { Chart, type Line } from "./Chart";

/** Optimizer steps whose median is shown: one slow step (a checkpoint save) does not move it. */
export const BREAKDOWN_WINDOW = 20;

type Part = { key: string; label: string; color: string; seconds: number | null; note?: string };

/** The trainer's timed parts of an optimizer step (seconds, slowest rank), as it writes them to the metrics. */
const MEASURED: [string, string, string][] = [
  ["forward_s", "forward", "var(--phase-forward)"],
  ["backward_s", "backward", "var(--phase-backward)"],
  ["optimizer_s", "optimizer step", "var(--phase-optimizer)"],
];

/** The planner's terms (plan/throughput.py time_breakdown_s), in the order of a step. */
const PREDICTED: [string, string, string][] = [
  ["compute", "compute", "var(--phase-forward)"],
  ["all_to_all", "Ulysses all-to-all", "var(--phase-comm)"],
  ["zero_comm", "ZeRO communication (exposed)", "var(--phase-backward)"],
  // its own colour: the host floor is most of a small model's step, and it sits beside the all-to-all in the bar
  ["host_overhead", "host overhead (the device waits)", "var(--phase-host)"],
  ["optimizer_step", "optimizer step", "var(--phase-optimizer)"],
  ["offload_transfers", "offload transfers", "var(--phase-offload)"],
];

/** Per step, the slowest rank's value of a metric (the trainer writes it once; a per-rank writer is folded here). */
function perStep(store: Store, name: string): Map<number, number> {
  const out = new Map<number, number>();
  for (const bySteps of store.get(name)?.values() ?? []) {
    for (const [step, v] of bySteps) out.set(step, Math.max(v, out.get(step) ?? -Infinity));
  }
  return out;
}

/** The median of the values at the last `window` steps, or null when there is none. */
export function recentMedian(values: Map<number, number>, window = BREAKDOWN_WINDOW): number | null {
  if (values.size === 0) return null;
  const recent = [...values.entries()].sort((a, b) => a[0] - b[0]).slice(-window).map(([, v]) => v).sort((a, b) => a - b);
  const mid = Math.floor(recent.length / 2);
  return recent.length % 2 ? recent[mid] : (recent[mid - 1] + recent[mid]) / 2;
}

function StackedBar({ parts, testid }: { parts: Part[]; testid: string }) {
  const drawn = parts.filter((p) => p.seconds !== null && p.seconds > 0);
  const total = drawn.reduce((t, p) => t + (p.seconds as number), 0);
  return (
    <div className="breakdown-bar" data-testid={testid} data-total={total}>
      {drawn.map((p) => (
        <div key={p.key} className="breakdown-seg" data-part={p.key} title={`${p.label}: ${fmtSeconds(p.seconds)}`}
          style={{ width: `${(100 * (p.seconds as number)) / total}%`, background: p.color }} />
      ))}
    </div>
  );
}

function PartList({ parts, testid }: { parts: Part[]; testid: string }) {
  return (
    <table className="table breakdown-table" data-testid={testid}>
      <tbody>
        {parts.map((p) => (
          <tr key={p.key} data-testid={`${testid}-${p.key}`} data-seconds={p.seconds ?? ""}>
            <td><i className="swatch" style={{ background: p.seconds === null ? "transparent" : p.color }} />{p.label}</td>
            <td className="num">{p.seconds === null ? <span className="muted">not measured</span> : fmtSeconds(p.seconds)}</td>
            {p.note ? <td className="muted small">{p.note}</td> : null}
          </tr>
        ))}
      </tbody>
    </table>
  );
}

/** Measured step-time breakdown (median of the last BREAKDOWN_WINDOW optimizer steps, and per step) beside the
 * planner's predicted breakdown for the plan's GPU. A part the trainer did not time is "not measured", never 0. */
export function StepBreakdown({ run, store, onZoom, onZoomReset }: {
  run: Run; store: Store; onZoom?: (a: number, b: number) => void; onZoomReset?: () => void;
}) {
  const { measured, chart, steps, rest, reporting } = useMemo(() => {
    const series = MEASURED.map(([name]) => perStep(store, name));
    const measured: Part[] = MEASURED.map(([name, label, color], i) => ({ key: name, label, color, seconds: recentMedian(series[i]) }));
    measured.push(
      { key: "communication", label: "communication (all-to-all, ZeRO)", color: "var(--phase-comm)", seconds: null,
        note: "not timed apart: inside forward and backward" },
      { key: "offload", label: "offload transfers", color: "var(--phase-offload)", seconds: null,
        note: "not timed apart: inside backward and the optimizer step" },
    );
    const total = recentMedian(perStep(store, "step_time_s"));
    const timed = measured.filter((p) => p.seconds !== null);
    // what the step time holds beyond the timed parts (data loading, logging), when every part was timed
    const rest = total !== null && timed.length === MEASURED.length
      ? Math.max(0, total - timed.reduce((t, p) => t + (p.seconds as number), 0)) : null;
    const x = [...new Set(series.flatMap((m) => [...m.keys()]))].sort((a, b) => a - b);
    const lines: Line[] = MEASURED.map(([, label, color], i) => ({
      label, color, values: x.map((s) => series[i].get(s) ?? null), width: 1.5,
    })).filter((_, i) => series[i].size > 0);
    const reporting = perStep(store, "step_time_s").size > 0 || (store.get("loss")?.size ?? 0) > 0;
    return { measured, chart: { x, lines }, steps: Math.max(0, ...series.map((m) => m.size)), rest, reporting };
  }, [store]);
  const terms = run.estimate?.throughput?.time_breakdown_s ?? null;
  const predicted: Part[] = PREDICTED.map(([key, label, color]) => ({
    key, label, color, seconds: terms && typeof terms[key] === "number" ? terms[key] : null,
  }));
  const measuredShown = rest !== null
    ? [...measured, { key: "rest", label: "rest of the step (data, logging)", color: "var(--phase-rest)", seconds: rest }]
    : measured;
  const predictedTotal = run.estimate?.throughput?.step_time_s;
  return (
    <div className="card step-breakdown" data-testid="step-breakdown" data-steps={steps}>
      <h3>Step time breakdown</h3>
      <div className="breakdown-cols">
        <div data-testid="breakdown-measured">
          <div className="chart-title">measured <span className="muted small">
            {steps ? `median of the last ${Math.min(steps, BREAKDOWN_WINDOW)} of ${steps} optimizer steps, slowest rank` : "no timed step yet"}
          </span></div>
          <StackedBar parts={measuredShown} testid="breakdown-measured-bar" />
          <PartList parts={measuredShown} testid="measured" />
        </div>
        <div data-testid="breakdown-predicted">
          <div className="chart-title">planner <span className="muted small">
            {terms ? `predicted for the plan's GPU, ${fmtSeconds(predictedTotal)} per step${run.device === "cpu" ? "; this run ran on CPU ranks, so not comparable" : ""}` : "no estimate"}
          </span></div>
          {terms ? <StackedBar parts={predicted} testid="breakdown-predicted-bar" /> : null}
          <PartList parts={predicted} testid="predicted" />
        </div>
      </div>
      <Chart testid="breakdown-chart" title="timed parts per optimizer step (s)" x={chart.x} lines={chart.lines}
        height={160} onZoom={onZoom} onZoomReset={onZoomReset}
        emptyText={reporting ? "not measured: this run's trainer writes no forward_s / backward_s / optimizer_s" : "no data yet"} />
    </div>
  );
}
