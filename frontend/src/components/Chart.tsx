import { useEffect, useRef, type KeyboardEvent } from "react";
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";
import { hiddenSeries, saveSeriesShown } from "../lib/chartState";
import { fmtGiB, fmtGiBTick, fmtTick, fmtValue } from "../lib/format";
import { axisSize } from "../lib/axisSize";
import { resolveColor, useColorScheme } from "../lib/theme";
import { zoomKey } from "./chartKeys";

export type Line = {
  label: string;
  values: (number | null)[];
  color: string;
  dash?: number[];
  width?: number;
};

type Props = {
  testid: string;
  title: string;
  x: number[];
  lines: Line[];
  height?: number;
  xLabel?: string;
  yLabel?: string;
  logX?: boolean;
  /** a log-scale y axis (a healthy loss beside a diverged one): values at or below 0 are not drawn */
  logY?: boolean;
  /** "GiB": the y values are memory in GiB, ticks in the unit of the axis ("512 MiB", "80 GiB") */
  yUnit?: "GiB";
  xFormat?: (v: number) => string;
  /** exposed as data-points so tests can count plotted points without reading pixels */
  points?: number;
  onZoom?: (min: number, max: number) => void;
  /** back to the whole run: the "0" key on a focused chart */
  onZoomReset?: () => void;
  /** pairs of indices into `lines` (upper, lower) to fill between */
  bands?: [number, number][];
  /** clamp the y axis (e.g. to keep a capacity line readable when some series go far above it) */
  yMax?: number;
  /** what an empty chart says (default: "no data yet") */
  emptyText?: string;
};

const STEP_INCRS = [1, 2, 5].flatMap((m) => Array.from({ length: 8 }, (_, e) => m * 10 ** e)).sort((a, b) => a - b);

export const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d", "#65a30d"];

/** The plotted columns; on a log y axis a value at or below 0 has no place and is left out. */
function data(x: number[], lines: Line[], logY?: boolean): uPlot.AlignedData {
  return [x, ...lines.map((l) => (logY ? l.values.map((v) => (v !== null && v > 0 ? v : null)) : l.values))];
}

/** A uPlot line chart that follows its container's width and updates in place when data changes. */
export function Chart({ testid, title, x, lines, height = 220, xLabel = "step", yLabel, logX, logY, yUnit, xFormat, points, onZoom, onZoomReset, yMax, bands, emptyText = "no data yet" }: Props) {
  const box = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  const zoomCb = useRef(onZoom);
  const scheme = useColorScheme();  // canvas colours are resolved at creation: a switch of scheme redraws
  // What the plot is built from when its shape changes (the data alone changes in place, below).
  const props = useRef({ x, lines, height, xLabel, yLabel, logX, logY, yUnit, xFormat, yMax, bands });
  useEffect(() => {
    zoomCb.current = onZoom;
    props.current = { x, lines, height, xLabel, yLabel, logX, logY, yUnit, xFormat, yMax, bands };
  });
  const shape = lines.map((l) => `${l.label}|${l.color}|${l.dash ?? ""}`).join(",") + `|${logX}|${logY}|${xLabel}|${height}|${yMax}|${JSON.stringify(bands ?? [])}|${scheme}`;

  useEffect(() => {
    const el = box.current;
    if (!el) return;
    const { x, lines, height, xLabel, yLabel, logX, logY, yUnit, xFormat, yMax, bands } = props.current;
    const axis = { stroke: resolveColor("var(--chart-axis)"), grid: { stroke: resolveColor("var(--chart-grid)") },
      ticks: { stroke: resolveColor("var(--chart-grid)") } };
    const hidden = hiddenSeries(testid);  // switched off in the legend, as the page's URL says
    const opts: uPlot.Options = {
      width: Math.max(200, el.clientWidth),
      height,
      scales: {
        x: logX ? { time: false, distr: 3, log: 2 } : { time: false },
        ...(logY ? { y: { distr: 3 } } : yMax !== undefined ? { y: { range: [0, yMax] as [number, number] } } : {}),
      },
      axes: [
        {
          ...axis,
          label: xLabel,
          // a log axis leaves the ticks it does not label null: those stay blank (never "0")
          values: (_u, vals) => {
            const span = vals.length > 1 ? Math.abs(vals[1] - vals[0]) : 0;
            return vals.map((v) => (v == null ? "" : xFormat ? xFormat(v) : fmtTick(v, span)));
          },
          ...(logX ? {} : { incrs: STEP_INCRS }), // steps are whole numbers
        },
        {
          ...axis,
          label: yLabel,
          // as wide as its widest tick label in the axis font (measured on the chart's own canvas)
          size: (u, values, axisIdx) => {
            const a = u.axes[axisIdx];
            const font = (Array.isArray(a.font) ? a.font[0] : a.font) ?? "12px sans-serif";
            const measure = (text: string, f: string) => {
              u.ctx.font = f;
              return u.ctx.measureText(text).width / (window.devicePixelRatio || 1);
            };
            return axisSize(values, String(font), measure, a.ticks?.size ?? 10, a.gap ?? 5);
          },
          values: (_u, vals) => {
            const span = vals.length > 1 ? Math.abs(vals[1] - vals[0]) : 0;
            const max = Math.max(...vals.filter((v) => v != null).map(Math.abs));
            return vals.map((v) => (v == null ? "" : yUnit === "GiB" ? fmtGiBTick(v, max) : fmtTick(v, span)));
          },
        },
      ],
      series: [
        // legend values through the same formatter as the axes ("–" where a series has no point)
        { label: xLabel, value: (_u, v) => (v == null ? "–" : xFormat ? xFormat(v) : fmtValue(v)) },
        ...lines.map((l) => ({
          label: l.label,
          value: (_u: uPlot, v: number | null) => (v == null ? "–" : yUnit === "GiB" ? fmtGiB(v) : fmtValue(v)),
          stroke: resolveColor(l.color),
          show: !hidden.has(l.label),
          width: l.width ?? 1.5,
          dash: l.dash,
          spanGaps: true,
          points: { show: (_u: uPlot, _s: number, i0: number, i1: number) => i1 - i0 < 25 },
        })),
      ],
      legend: { live: true },
      bands: bands?.map(([hi, lo]) => ({ series: [hi + 1, lo + 1] as [number, number], fill: "rgba(37,99,235,0.12)" })),
      cursor: { drag: { x: true, y: false } },
      hooks: {
        // the tick labels as drawn (the canvas holds no text): data-x-ticks / data-y-ticks, for tests and readers
        draw: [
          (u) => {
            const ticks = (i: number) => JSON.stringify(((u.axes[i] as { _values?: (string | null)[] })._values ?? [])
              .filter((t) => t !== null && t !== ""));
            el.dataset.xTicks = ticks(0);
            el.dataset.yTicks = ticks(1);
          },
        ],
        // a legend click shows or hides a series: kept in the URL so a copied link opens the same selection
        setSeries: [
          (u, i) => {
            const s = i == null ? undefined : u.series[i];
            if (s && typeof s.label === "string") saveSeriesShown(testid, s.label, s.show !== false);
          },
        ],
        setSelect: [
          (u) => {
            if (u.select.width > 4 && zoomCb.current) {
              const min = u.posToVal(u.select.left, "x");
              const max = u.posToVal(u.select.left + u.select.width, "x");
              zoomCb.current(min, max);
            }
          },
        ],
      },
    };
    const u = new uPlot(opts, data(x, lines, logY), el);
    plot.current = u;
    const ro = new ResizeObserver(() => u.setSize({ width: Math.max(200, el.clientWidth), height }));
    ro.observe(el);
    return () => {
      ro.disconnect();
      u.destroy();
      plot.current = null;
    };
  }, [shape, testid]);

  useEffect(() => {
    plot.current?.setData(data(x, lines, logY));
  }, [x, lines, logY]);

  const n = points ?? x.length;
  const keys = onZoom ? {
    tabIndex: 0, role: "group",
    "aria-label": `${title}: + and - zoom, left and right arrows pan, 0 shows the whole run`,
    onKeyDown: (e: KeyboardEvent) => {
      const next = zoomKey(e.key, x[0], x[x.length - 1]);  // the steps shown (a zoom loads only its range)
      if (next === null) return;
      e.preventDefault();
      if (next === "reset") onZoomReset?.();
      else onZoom(next[0], next[1]);
    },
  } : {};
  return (
    <div className="chart card" data-testid={testid} data-points={n} data-x={xLabel} data-log-y={logY ? "true" : "false"} {...keys}>
      <div className="chart-title">
        {title} <span className="muted">({n} points)</span>
      </div>
      {x.length === 0 ? <div className="chart-empty muted" data-testid={`${testid}-empty`}>{emptyText}</div> : null}
      <div ref={box} className="chart-plot" style={{ display: x.length === 0 ? "none" : undefined }} />
    </div>
  );
}
