import { useEffect, useMemo, useState } from "react";
import { PALETTE, type Line } from "../../components/Chart";
import { ShareLink } from "../../components/ShareLink";
import { StepBreakdown } from "../../components/StepBreakdown";
import { readLogY, readPlannerLines, readSmoothing, readXKind, saveLogY, savePlannerLines, saveSmoothing, saveXKind, saveZoom, type XKind } from "../../lib/chartState";
import { INK } from "../../lib/theme";
import type { Run } from "../../lib/api";
import { ema, fmtGiB, fmtNum, fmtSeconds } from "../../lib/format";
import { EvalCharts } from "./EvalCharts";
import { aligned, rankLabels, single } from "./series";
import { OverlayChart, useView, ViewChart, type View } from "./ViewChart";
import type { Store, Zoom } from "./useRunData";

const SMOOTHING = 0.6;  // the loss EMA factor a page opens with (a shared link may give another)
type Props = { run: Run; store: Store; zoom: Zoom; setZoom: (z: Zoom) => void };

function MetricChart({ view, store, name, title, testid, predicted, onZoom, onZoomReset, scale = 1, showPlanner = true, format = (v) => fmtNum(v, 2) }: {
  view: View; store: Store; name: string; title: string; testid: string; format?: (v: number) => string;
  predicted?: number | null; onZoom: (a: number, b: number) => void; onZoomReset: () => void; scale?: number; showPlanner?: boolean;
}) {
  const { x, lines, offScale } = useMemo(() => {
    const s = single(store, name);
    const y = scale === 1 ? s.y : s.y.map((v) => (v === null ? null : v * scale));
    const lines: Line[] = [{ label: name, values: y, color: PALETTE[0] }];
    // A prediction more than 10x away from every measured point (an H100 plan trained on CPU ranks, say) would
    // flatten the measured curve against the axis: it stays in the title, not drawn.
    const seen = y.filter((v): v is number => v !== null && v > 0);
    const offScale = predicted != null && predicted > 0 && seen.length > 0
      && (predicted > 10 * Math.max(...seen) || predicted < Math.min(...seen) / 10);
    if (predicted != null && showPlanner && !offScale) lines.push({ label: "planner", values: s.x.map(() => predicted), color: INK, dash: [6, 4] });
    return { x: s.x, lines, offScale };
  }, [store, name, predicted, scale, showPlanner]);
  const how = offScale ? ", over 10x off the measurement: not drawn" : showPlanner ? ", dashed" : "";
  const full = predicted != null ? `${title} (planner: ${format(predicted)}${how})` : title;
  // Steps have arrived but none carries this metric: the trainer does not report it (MFU is null on CPU ranks,
  // which have no peak TFLOPS to divide by), so waiting will not help.
  const reportsSteps = x.length === 0 && single(store, "loss").x.length > 0;
  const emptyText = !reportsSteps ? "no data yet"
    : name === "mfu" ? "not reported: MFU needs a GPU's peak TFLOPS (null on CPU ranks)" : "not reported by this run";
  return <ViewChart view={view} testid={testid} title={full} x={x} lines={lines} onZoom={onZoom} onZoomReset={onZoomReset} height={180} emptyText={emptyText} />;
}

/** One line per rank of a metric every rank reports (the system figures). */
function RankChart({ view, store, name, title, testid, onZoom, onZoomReset, noData }: {
  view: View; store: Store; name: string; title: string; testid: string; onZoom: (a: number, b: number) => void;
  onZoomReset: () => void; noData?: string;
}) {
  const { x, lines, n } = useMemo(() => {
    const a = aligned(store, name);
    const lines: Line[] = a.ranks.map((r, i) => ({
      label: `rank ${r}`, values: a.values[i], color: PALETTE[i % PALETTE.length],
      ...(i === 0 ? { width: 2 } : { dash: [5, 5], width: 1.5 }),
    }));
    return { x: a.x, lines, n: a.values.reduce((k, v) => k + v.filter((p) => p !== null).length, 0) };
  }, [store, name]);
  const reportsSteps = x.length === 0 && single(store, "loss").x.length > 0;
  return <ViewChart view={view} testid={testid} title={title} x={x} lines={lines} points={n} onZoom={onZoom} onZoomReset={onZoomReset} height={160}
    yUnit={name.endsWith("_gib") ? "GiB" : undefined}
    emptyText={noData ?? (reportsSteps ? "not reported by this run" : "no data yet")} />;
}

const GPU_CHARTS: [string, string, string][] = [
  ["gpu_util_percent", "GPU utilisation (%)", "gpu-util-chart"],
  ["gpu_mem_used_gib", "GPU memory in use (GiB, nvidia-smi)", "gpu-mem-chart"],
  ["gpu_power_w", "GPU power (W)", "gpu-power-chart"],
  ["gpu_temp_c", "GPU temperature (°C)", "gpu-temp-chart"],
];

/** Host and GPU figures per rank (worker/trainer/system.py). A run on CPU ranks has no GPU to read: its GPU
 * charts say so instead of waiting for data. */
function SystemCharts({ view, run, store, onZoom, onZoomReset }: { view: View; run: Run; store: Store; onZoom: (a: number, b: number) => void; onZoomReset: () => void }) {
  const noGpu = run.device === "cpu" ? "no GPU: this run ran on CPU ranks" : undefined;
  return (
    <details className="card" open data-testid="system-charts" data-no-gpu={noGpu ? "true" : "false"}>
      <summary>System (per rank)</summary>
      <div className="chart-grid">
        <RankChart view={view} store={store} name="cpu_percent" title="CPU of the rank's process (% of one core)" testid="cpu-chart" onZoom={onZoom} onZoomReset={onZoomReset} />
        <RankChart view={view} store={store} name="rss_gib" title="resident memory of the rank (GiB)" testid="rss-chart" onZoom={onZoom} onZoomReset={onZoomReset} />
        <RankChart view={view} store={store} name="host_cpu_percent" title="host CPU (% of all cores)" testid="host-cpu-chart" onZoom={onZoom} onZoomReset={onZoomReset} />
        {GPU_CHARTS.map(([name, title, testid]) => (
          <RankChart view={view} key={name} store={store} name={name} title={title} testid={testid} onZoom={onZoom} onZoomReset={onZoomReset} noData={noGpu} />
        ))}
      </div>
    </details>
  );
}

export function RunCharts({ run, store, zoom, setZoom }: Props) {
  const [smooth, setSmooth] = useState(() => readSmoothing() ?? SMOOTHING);
  const [showPlanner, setShowPlanner] = useState(readPlannerLines);
  const [xKind, setXKind] = useState<XKind>(readXKind);
  const [logY, setLogY] = useState(readLogY);
  useEffect(() => {
    saveZoom(zoom); saveSmoothing(smooth, SMOOTHING); savePlannerLines(showPlanner); saveXKind(xKind); saveLogY(logY);
  }, [zoom, smooth, showPlanner, xKind, logY]);
  const view = useView(run, xKind, logY);
  const onZoom = (a: number, b: number) => setZoom({ start: Math.max(0, Math.floor(a)), end: Math.ceil(b) });
  const onZoomReset = () => setZoom(null);
  // The planner predicts the plan's GPU; a run on CPU ranks is not comparable to it, so no planner figure is drawn.
  const onCpu = run.device === "cpu";
  const predictedPeak = onCpu ? null : run.estimate?.memory?.peak_allocated_gib ?? null;
  const thr = onCpu ? null : run.estimate?.throughput ?? null;

  const loss = useMemo(() => {
    const s = single(store, "loss");
    const lines: Line[] = [
      { label: "loss", values: s.y, color: smooth > 0 ? "rgba(37,99,235,0.3)" : PALETTE[0], width: 1 },
    ];
    if (smooth > 0) lines.push({ label: "EMA", values: ema(s.y, smooth), color: PALETTE[0], width: 2 });
    // Bucketed history (long runs): the min..max of each bucket as a band behind the line.
    const lo = store.get("loss#min")?.get(0);
    const hi = store.get("loss#max")?.get(0);
    let bands: [number, number][] | undefined;
    if (lo && hi && lo.size) {
      const at = (m: Map<number, number>) => s.x.map((st) => m.get(st) ?? null);
      lines.push({ label: "bucket max", values: at(hi), color: "rgba(37,99,235,0.25)", width: 0.5 });
      lines.push({ label: "bucket min", values: at(lo), color: "rgba(37,99,235,0.25)", width: 0.5 });
      bands = [[lines.length - 2, lines.length - 1]];
    }
    return { x: s.x, lines, n: s.y.filter((v) => v !== null).length, bands };
  }, [store, smooth]);

  const memory = useMemo(() => {
    const a = aligned(store, "peak_allocated_gib");
    // Ranks with equal values (SP ranks hold equal shards) would hide each other: every rank after the first is
    // drawn dashed and thinner over the wider solid lines, and one that overlaps an earlier rank at most steps is
    // labelled with it ("rank 1 = rank 0 at 39/40 steps", series.rankLabels), so both stay visible.
    const labels = rankLabels(a.ranks, a.values);
    const lines: Line[] = a.ranks.map((_r, i) => ({
      label: labels[i], values: a.values[i], color: PALETTE[i % PALETTE.length],
      ...(i === 0 ? { width: 3 } : { dash: [5, 5], width: 1.5 }),
    }));
    const equalRanks = lines.filter((l) => l.label.includes("(= rank")).length;
    if (predictedPeak != null && a.x.length && showPlanner) {
      lines.push({ label: "planner peak", values: a.x.map(() => predictedPeak), color: INK, dash: [6, 4], width: 2 });
    }
    let measured: number | null = null;
    for (const v of a.values) for (const p of v) if (p !== null && (measured === null || p > measured)) measured = p;
    return { x: a.x, lines, n: a.values.reduce((n, v) => n + v.filter((p) => p !== null).length, 0), measured, equalRanks };
  }, [store, predictedPeak, showPlanner]);

  return (
    <div className="run-charts">
      <div className="chart-tools">
        <label className="smooth">
          EMA smoothing
          <input type="range" min={0} max={0.99} step={0.01} value={smooth} data-testid="smoothing"
            onChange={(e) => setSmooth(Number(e.target.value))} />
          <span data-testid="smoothing-value">{smooth.toFixed(2)}</span>
        </label>
        <label className="smooth">
          <input type="checkbox" checked={showPlanner} data-testid="toggle-planner" onChange={(e) => setShowPlanner(e.target.checked)} />
          planner predictions as lines
        </label>
        {onCpu ? <span className="muted" data-testid="planner-hidden-cpu">planner predictions hidden: this run ran on CPU ranks, the planner predicts the plan's GPU</span> : null}
        {zoom ? (
          <span>
            <span data-testid="zoom-range">steps {zoom.start}–{zoom.end}</span>{" "}
            <button type="button" data-testid="zoom-reset" onClick={() => setZoom(null)}>reset zoom</button>
          </span>
        ) : <span className="muted">drag on a chart to zoom (or focus it: + / - / arrows / 0)</span>}
        <label className="smooth">x
          <select data-testid="x-axis" value={xKind} onChange={(e) => setXKind(e.target.value as XKind)}>
            <option value="step">step</option><option value="time">wall time</option><option value="tokens">tokens</option>
          </select>
        </label>
        <label className="smooth">
          <input type="checkbox" checked={logY} data-testid="log-y" onChange={(e) => setLogY(e.target.checked)} />
          log y
        </label>
        <ShareLink run={run} />
      </div>
      <OverlayChart store={store} view={view} />
      <StepBreakdown run={run} store={store} onZoom={onZoom} onZoomReset={onZoomReset} />
      <div className="chart-grid">
        <ViewChart view={view} testid="loss-chart" title="loss" x={loss.x} lines={loss.lines} points={loss.n} bands={loss.bands} onZoom={onZoom} onZoomReset={onZoomReset} height={240} />
        <div data-testid="memory-chart-wrap" data-predicted-gib={predictedPeak ?? ""} data-measured-gib={memory.measured ?? ""} data-equal-ranks={memory.equalRanks}>
          <ViewChart view={view} logY={false} testid="memory-chart" title={`peak allocated memory per rank${memory.measured != null ? `: max ${fmtGiB(memory.measured)}` : ""}${predictedPeak != null ? `, planner ${fmtGiB(predictedPeak)}${showPlanner ? " dashed" : ""}` : ""}`}
            yUnit="GiB" x={memory.x} lines={memory.lines} points={memory.n} onZoom={onZoom} onZoomReset={onZoomReset} height={240} />
        </div>
        <MetricChart view={view} store={store} name="lr" title="learning rate" testid="lr-chart" onZoom={onZoom} onZoomReset={onZoomReset} showPlanner={showPlanner} />
        <MetricChart view={view} store={store} name="grad_norm" title="grad norm" testid="grad-norm-chart" onZoom={onZoom} onZoomReset={onZoomReset} showPlanner={showPlanner} />
        <MetricChart view={view} store={store} name="tokens_per_s" title="tokens/s (job)" testid="tokens-chart"
          predicted={thr?.tokens_per_s} onZoom={onZoom} onZoomReset={onZoomReset} showPlanner={showPlanner} />
        <MetricChart view={view} store={store} name="tflops_per_gpu" title="TFLOPS per GPU" testid="tflops-chart"
          predicted={thr?.tflops_per_gpu} onZoom={onZoom} onZoomReset={onZoomReset} showPlanner={showPlanner} />
        <MetricChart view={view} store={store} name="mfu" title="MFU (%)" testid="mfu-chart"
          predicted={thr ? thr.mfu * 100 : null} scale={100} onZoom={onZoom} onZoomReset={onZoomReset} showPlanner={showPlanner} />
        <MetricChart view={view} store={store} name="step_time_s" title="step time (s)" testid="step-time-chart" format={fmtSeconds}
          predicted={thr?.step_time_s} onZoom={onZoom} onZoomReset={onZoomReset} showPlanner={showPlanner} />
      </div>
      <EvalCharts store={store} />
      <SystemCharts view={view} run={run} store={store} onZoom={onZoom} onZoomReset={onZoomReset} />
    </div>
  );
}
