import { useQuery } from "@tanstack/react-query";
import { useMemo, useState, type ComponentProps } from "react";
import { Chart, PALETTE, type Line } from "../../components/Chart";
import { client, unwrap, type Run } from "../../lib/api";
import { readOverlay, saveOverlay, type XKind } from "../../lib/chartState";
import { isTerminal } from "../../lib/states";
import { remap, stepTo, X_AXES, type StepAxes } from "../../lib/xAxis";
import type { Store } from "./useRunData";

/** How the run page's metric charts are drawn: what is on x, and whether y is on a log scale. */
export type View = { x: XKind; axes: StepAxes | null; logY: boolean };

/** The run's steps with their wall time and tokens, read only while a chart puts one of them on x. */
export function useView(run: Run, x: XKind, logY: boolean): View {
  const axes = useQuery({
    queryKey: ["axes", run.id],
    enabled: x !== "step",
    queryFn: () => unwrap(client.GET("/api/runs/{run_id}/metrics/axes", { params: { path: { run_id: run.id } } })),
    refetchInterval: isTerminal(run.state) ? false : 3000,
  });
  return { x, axes: axes.data ?? null, logY };
}

/** A chart of series drawn by step, put on the view's x axis (zoom by dragging stays a step range: by step only). */
export function ViewChart({ view, x, lines, logY = true, onZoom, ...rest }: ComponentProps<typeof Chart> & { view: View }) {
  const moved = useMemo(() => remap(x, lines, stepTo(view.x, view.axes)), [x, lines, view.x, view.axes]);
  const axis = X_AXES[view.x];
  return <Chart {...rest} x={moved.x} lines={moved.lines} xLabel={axis.label} xFormat={axis.format}
    logY={logY && view.logY} onZoom={view.x === "step" ? onZoom : undefined} />;
}

/** Several metrics on one chart, chosen from those the run reports (rank 0's series); the choice is in the URL. */
export function OverlayChart({ store, view }: { store: Store; view: View }) {
  const [chosen, setChosen] = useState<string[]>(() => readOverlay());
  const names = useMemo(() => [...store.keys()].filter((n) => !n.includes("#")).sort(), [store]);
  const { x, lines, n } = useMemo(() => {
    const steps = new Set<number>();
    const series = chosen.filter((c) => store.has(c)).map((name) => {
      const byStep = store.get(name)!.get(Math.min(...store.get(name)!.keys())) ?? new Map<number, number>();
      for (const s of byStep.keys()) steps.add(s);
      return { name, byStep };
    });
    const x = [...steps].sort((a, b) => a - b);
    const lines: Line[] = series.map(({ name, byStep }, i) => ({
      label: name, values: x.map((s) => byStep.get(s) ?? null), color: PALETTE[i % PALETTE.length],
    }));
    return { x, lines, n: lines.reduce((k, l) => k + l.values.filter((v) => v !== null).length, 0) };
  }, [store, chosen]);
  const toggle = (name: string, on: boolean) => {
    const next = on ? [...chosen, name] : chosen.filter((c) => c !== name);
    setChosen(next);
    saveOverlay(next);
  };
  return (
    <details className="card" open={chosen.length > 0} data-testid="overlay">
      <summary>Several metrics on one chart</summary>
      <div className="overlay-pick">
        {names.map((name) => (
          <label key={name} className="switch"><input type="checkbox" data-testid={`overlay-${name}`} checked={chosen.includes(name)}
            onChange={(e) => toggle(name, e.target.checked)} />{name}</label>
        ))}
      </div>
      {chosen.length ? <ViewChart view={view} testid="overlay-chart" title={chosen.join(", ")} x={x} lines={lines} points={n} height={260} />
        : <div className="muted">Pick two or more metrics to draw them together (a log y axis keeps different scales readable).</div>}
    </details>
  );
}
