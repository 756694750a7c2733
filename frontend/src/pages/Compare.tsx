import { useQueries, useQuery } from "@tanstack/react-query";
import { useMemo, useState } from "react";
import { Chart, PALETTE, type Line } from "../components/Chart";
import { client, unwrap, type Run } from "../lib/api";
import { ema, fmtGiB } from "../lib/format";
import { navigate } from "../lib/route";

type Series = { step: number[]; value: number[] };

function flatten(obj: unknown, prefix = "", out: Record<string, string> = {}): Record<string, string> {
  if (obj && typeof obj === "object" && !Array.isArray(obj)) {
    for (const [k, v] of Object.entries(obj)) flatten(v, prefix ? `${prefix}.${k}` : k, out);
  } else {
    out[prefix] = JSON.stringify(obj);
  }
  return out;
}

/** Each attempt's effective plan (a resume may change the learning rate or schedule); the live or queued attempt, not
 * recorded yet, reads the run's current plan. */
function attemptPlans(run: Run): { attempt: number; spec: unknown }[] {
  const kept = (run.attempts ?? []).flatMap((a) => (a.spec ? [{ attempt: a.attempt, spec: a.spec as unknown }] : []));
  return kept.some((a) => a.attempt === run.attempt) ? kept : [...kept, { attempt: run.attempt, spec: run.spec }];
}

/** The fields in which a run's attempts differ, one column per attempt. */
function AttemptDiff({ run }: { run: Run }) {
  const plans = attemptPlans(run);
  if (plans.length < 2) return null;
  const flats = plans.map((p) => flatten(p.spec));
  const keys = [...new Set(flats.flatMap((f) => Object.keys(f)))].sort();
  const rows = keys.map((k) => ({ k, vals: flats.map((f) => f[k] ?? "–") })).filter((row) => new Set(row.vals).size > 1);
  return (
    <div className="card">
      <h3>Attempts of #{run.id} {run.name}</h3>
      <div className="scroll-x">
        <table className="table" data-testid={`attempt-diff-${run.id}`} data-rows={rows.length}>
          <thead><tr><th>field</th>{plans.map((p) => <th key={p.attempt}>attempt {p.attempt}</th>)}</tr></thead>
          <tbody>
            {rows.map((row) => (
              <tr key={row.k} data-testid={`attempt-diff-${run.id}-${row.k}`}>
                <td className="mono">{row.k}</td>{row.vals.map((v, i) => <td key={i} className="mono">{v}</td>)}
              </tr>
            ))}
          </tbody>
        </table>
        {rows.length === 0 ? <div className="muted">Every attempt ran the same plan.</div> : null}
      </div>
    </div>
  );
}

/** Overlay one metric across runs; per-rank metrics show the highest rank value at each step. */
async function loadMetric(id: number, name: string): Promise<Series> {
  const r = await unwrap(client.GET("/api/runs/{run_id}/metrics", { params: { path: { run_id: id }, query: { name, points: 1000 } } }));
  const byStep = new Map<number, number>();
  for (const s of r.series) s.step.forEach((st, i) => byStep.set(st, Math.max(byStep.get(st) ?? -Infinity, s.last[i])));
  const step = [...byStep.keys()].sort((a, b) => a - b);
  return { step, value: step.map((s) => byStep.get(s)!) };
}

export function Compare({ ids }: { ids: number[] }) {
  const [metric, setMetric] = useState("loss");
  const [smooth, setSmooth] = useState(0);
  const [onlyDiff, setOnlyDiff] = useState(true);

  const listed = useQuery({
    queryKey: ["runs", ""],
    queryFn: ({ signal }) => unwrap(client.GET("/api/runs", { params: { query: {} }, signal })) as Promise<Run[]>,
  });
  const all = useMemo(() => listed.data ?? [], [listed.data]);
  const runs = useMemo(() => ids.map((id) => all.find((r) => r.id === id)).filter(Boolean) as Run[], [all, ids]);

  // Every metric any of the runs recorded, and the chosen metric of each run; a run whose read fails says so.
  const named = useQueries({
    queries: ids.map((id) => ({
      queryKey: ["metric-names", id],
      queryFn: () => unwrap(client.GET("/api/runs/{run_id}/metrics/names", { params: { path: { run_id: id } } })),
    })),
    combine: (rs) => ({
      names: [...new Set(rs.flatMap((r) => r.data ?? []))].sort(),
      errors: rs.flatMap((r, i) => (r.error ? [`#${ids[i]} metric names: ${r.error.message}`] : [])),
    }),
  });
  const loaded = useQueries({
    queries: ids.map((id) => ({ queryKey: ["compare-metric", id, metric], queryFn: () => loadMetric(id, metric) })),
    combine: (rs) => ({
      data: Object.fromEntries(ids.flatMap((id, i) => { const d = rs[i].data; return d ? [[id, d]] : []; })) as Record<number, Series>,
      errors: rs.flatMap((r, i) => (r.error ? [`#${ids[i]} ${metric}: ${r.error.message}`] : [])),
    }),
  });
  const names = named.names.length ? named.names : ["loss"];
  const data = loaded.data;
  const errors = [...(listed.error ? [`runs: ${listed.error.message}`] : []), ...named.errors, ...loaded.errors];

  const chart = useMemo(() => {
    const steps = new Set<number>();
    for (const s of Object.values(data)) s.step.forEach((x) => steps.add(x));
    const x = [...steps].sort((a, b) => a - b);
    const lines: Line[] = ids.map((id, i) => {
      const s = data[id] ?? { step: [], value: [] };
      const m = new Map(s.step.map((st, j) => [st, s.value[j]]));
      const raw = x.map((st) => (m.has(st) ? m.get(st)! : null));
      return { label: `#${id} ${runs.find((r) => r.id === id)?.name ?? ""}`, values: ema(raw, smooth), color: PALETTE[i % PALETTE.length] };
    });
    const n = Object.values(data).reduce((a, s) => a + s.step.length, 0);
    return { x, lines, n };
  }, [data, ids, runs, smooth]);

  const diff = useMemo(() => {
    const flats: Record<string, string>[] = runs.map((r) => ({
      ...flatten(r.spec),
      "planner.peak_allocated_gib": fmtGiB(r.estimate?.memory?.peak_allocated_gib),
      "planner.tokens_per_s": String(Math.round(r.estimate?.throughput?.tokens_per_s ?? 0)),
    }));
    const keys = [...new Set(flats.flatMap((f) => Object.keys(f)))].sort();
    return keys
      .map((k) => ({ k, vals: flats.map((f) => f[k] ?? "–") }))
      .filter((row) => !onlyDiff || new Set(row.vals).size > 1);
  }, [runs, onlyDiff]);

  const toggle = (id: number) => {
    const next = ids.includes(id) ? ids.filter((x) => x !== id) : [...ids, id];
    navigate(`/compare?ids=${next.join(",")}`);
  };

  return (
    <div className="compare-page" data-testid="compare-page">
      <div className="card">
        <h3>Runs</h3>
        <div className="pick-list" data-testid="compare-picker">
          {all.map((r) => (
            <label key={r.id} className="pick">
              <input type="checkbox" data-testid={`compare-pick-${r.id}`} checked={ids.includes(r.id)} onChange={() => toggle(r.id)} />
              #{r.id} {r.name} <span className="muted">{r.state}</span>
            </label>
          ))}
        </div>
      </div>
      <div className="toolbar">
        <label>metric{" "}
          <select data-testid="compare-metric" value={metric} onChange={(e) => setMetric(e.target.value)}>
            {names.map((n) => <option key={n}>{n}</option>)}
          </select>
        </label>
        <label className="smooth">EMA
          <input type="range" min={0} max={0.99} step={0.01} value={smooth} onChange={(e) => setSmooth(Number(e.target.value))} />
          {smooth.toFixed(2)}
        </label>
      </div>
      {errors.length ? <div className="card error" data-testid="compare-errors">{errors.map((e) => <div key={e}>{e}</div>)}</div> : null}
      <Chart testid="compare-chart" title={`${metric} by run`} x={chart.x} lines={chart.lines} points={chart.n} height={300} />
      <div className="card">
        <div className="row-between">
          <h3>Configuration</h3>
          <label><input type="checkbox" checked={onlyDiff} onChange={(e) => setOnlyDiff(e.target.checked)} /> differences only</label>
        </div>
        <div className="scroll-x">
          <table className="table" data-testid="compare-diff" data-rows={diff.length}>
            <thead><tr><th>field</th>{runs.map((r) => <th key={r.id}>#{r.id} {r.name}</th>)}</tr></thead>
            <tbody>
              {diff.map((row) => (
                <tr key={row.k} data-testid={`diff-${row.k}`}><td className="mono">{row.k}</td>{row.vals.map((v, i) => <td key={i} className="mono">{v}</td>)}</tr>
              ))}
            </tbody>
          </table>
          {runs.length >= 2 && diff.length === 0 ? <div className="muted">The configurations are identical.</div> : null}
          {runs.length < 2 ? <div className="muted" data-testid="compare-hint">Pick two or more runs above.</div> : null}
        </div>
      </div>
      {runs.map((r) => <AttemptDiff key={r.id} run={r} />)}
    </div>
  );
}
