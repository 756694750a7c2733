import { useQuery } from "@tanstack/react-query";
import { client, unwrap } from "../lib/api";
import { fmtGiB, fmtNum, fmtSeq } from "../lib/format";

const FIGURES: [string, string][] = [
  ["peak_allocated_gib", "peak allocated"], ["reserved_gib", "reserved"], ["device_total_gib", "device total"],
  ["tokens_per_s", "tokens/s"],
];
type Err = { n: number; mean_error: number | null; worst_error: number | null };
type Corr = { factor: number; residual: number; n: number } | null;

/** CPU ranks are filed under "cpu": the planner predicts for GPUs only, so their rows have no prediction to compare. */
const CPU = "cpu";
const NO_CPU_PREDICTION = "no CPU prediction";

const pct = (v: number | null | undefined) => (v == null ? "–" : `${v > 0 ? "+" : ""}${(100 * v).toFixed(1)}%`);

function ErrCell({ e }: { e: Err }) {
  return <td title={`${e.n} points; worst ${pct(e.worst_error)}`}>{e.n ? `${pct(e.mean_error)} (n=${e.n})` : "–"}</td>;
}

/** The planner's error on finished runs and gpu-check results, per GPU type and feature set, and the opt-in fitted
 * correction per GPU type with its residual. */
export function CalibrationPage() {
  const { data: cal, error } = useQuery({ queryKey: ["calibration"], queryFn: () => unwrap(client.GET("/api/calibration")) });
  if (error) return <div className="card error">Could not load calibration: {error.message}</div>;
  if (!cal) return <div className="muted">loading calibration…</div>;
  const errors = (gpu: string, x: Record<string, Err>) => FIGURES.map(([k]) => (gpu === CPU
    ? <td key={k} className="muted" data-testid={`calibration-error-${gpu}-${k}`}>{NO_CPU_PREDICTION}</td>
    : <ErrCell key={k} e={x[k]} />));
  return (
    <div data-testid="calibration-page">
      <div className="card">
        <h2>Calibration</h2>
        <div className="muted">Every finished run (and every row of <span className="mono">bench/results/gpu-*.csv</span> from
          make gpu-check) beside the planner's prediction for its plan. Error = (predicted − measured) / measured. The fitted
          correction (measured = factor × predicted) is shown with its residual; the planner never applies it on its own
          (POST /api/calibration/estimate applies it on request).</div>
      </div>
      <div className="card" data-testid="calibration-by-gpu">
        <h3>Per GPU type</h3>
        <div className="table-wrap">
        <table className="table">
          <thead><tr><th>GPU</th><th>points</th>{FIGURES.map(([, l]) => <th key={l}>{l} error</th>)}{FIGURES.map(([, l]) => <th key={l}>{l} correction</th>)}</tr></thead>
          <tbody>
            {cal.by_gpu.map((g) => (
              <tr key={g.gpu} data-testid={`calibration-gpu-${g.gpu}`}>
                <td>{g.gpu === CPU ? "CPU ranks" : g.gpu}</td><td>{g.n}</td>{errors(g.gpu, g.errors as unknown as Record<string, Err>)}
                {FIGURES.map(([k]) => {
                  const c = (g.correction as unknown as Record<string, Corr>)[k];
                  return <td key={k} data-testid={`correction-${g.gpu}-${k}`}>{g.gpu === CPU ? NO_CPU_PREDICTION : c ? `×${c.factor.toFixed(3)} (residual ${(100 * c.residual).toFixed(1)}%, n=${c.n})` : "too few points"}</td>;
                })}
              </tr>
            ))}
          </tbody>
        </table>
        </div>
      </div>
      <div className="card" data-testid="calibration-by-features">
        <h3>Per feature set</h3>
        <div className="table-wrap">
        <table className="table">
          <thead><tr><th>GPU</th><th>features</th><th>points</th>{FIGURES.map(([, l]) => <th key={l}>{l} error</th>)}</tr></thead>
          <tbody>
            {cal.by_features.map((f) => (
              <tr key={f.gpu + f.features}><td>{f.gpu === CPU ? "CPU ranks" : f.gpu}</td><td className="mono">{f.features}</td><td>{f.n}</td>{errors(f.gpu, f.errors as unknown as Record<string, Err>)}</tr>
            ))}
          </tbody>
        </table>
        </div>
      </div>
      <div className="card" data-testid="calibration-points">
        <h3>Predicted vs measured</h3>
        {!cal.points.length ? <div className="muted" data-testid="calibration-empty">No finished run or gpu-check row yet.</div> : (
          <div className="table-wrap">
          <table className="table">
            <thead><tr><th>source</th><th>GPU × n</th><th>seq_len</th><th>features</th>
              <th>allocated (pred / meas)</th><th>reserved</th><th>device total</th><th>tokens/s</th></tr></thead>
            <tbody>
              {cal.points.map((p) => {
                const cpu = p.gpu === CPU;
                const pred = (v: number | null | undefined, f: (x: number | null | undefined) => string) => (cpu ? NO_CPU_PREDICTION : f(v));
                return (
                  <tr key={p.id} data-testid={`calibration-point-${p.id}`} data-device={cpu ? CPU : "gpu"}>
                    <td>{p.run_id ? <a href={`#/runs/${p.run_id}`}>{p.source_ref}</a> : p.source_ref}</td>
                    <td>{cpu ? `CPU ranks × ${p.world}` : `${p.gpu} × ${p.world}`}</td><td>{fmtSeq(p.seq_len)}</td><td className="mono">{p.features}</td>
                    <td>{pred(p.predicted_peak_allocated_gib, fmtGiB)} / {fmtGiB(p.measured_peak_allocated_gib)}</td>
                    <td>{pred(p.predicted_reserved_gib, fmtGiB)} / {fmtGiB(p.measured_reserved_gib)}</td>
                    <td>{pred(p.predicted_device_total_gib, fmtGiB)} / {fmtGiB(p.measured_device_total_gib)}</td>
                    <td data-testid={`calibration-point-${p.id}-tokens`}>{pred(p.predicted_tokens_per_s, (v) => fmtNum(v))} / {fmtNum(p.measured_tokens_per_s)}</td>
                  </tr>
                );
              })}
            </tbody>
          </table>
          </div>
        )}
      </div>
    </div>
  );
}
