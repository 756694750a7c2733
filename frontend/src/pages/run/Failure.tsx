import type { Run } from "../../lib/api";
import { fmtGiB, fmtTime } from "../../lib/format";
import { withShare } from "../../lib/share";
import { isFailure } from "../../lib/states";

/** Why a broken run ended (failed, out of memory, worker lost); nothing for any other state. */
export function ErrorPanel({ run }: { run: Run }) {
  if (!isFailure(run.state)) return null;
  return (
    <div className="card error" data-testid="error-panel">
      <h3>{run.state === "oom" ? "Out of memory" : run.state === "lost" ? "Worker lost (heartbeat stopped)" : "Run failed"}</h3>
      <pre className="log">{run.exit_reason || "no reason recorded"}</pre>
      {run.state === "oom" && run.estimate?.memory ? (
        <div>The planner predicted {fmtGiB(run.estimate.memory.device_total_gib)} per GPU against {fmtGiB(run.estimate.memory.gpu_capacity_gib)}.</div>
      ) : null}
    </div>
  );
}

/** Each attempt of a run tried more than once: who ran it, when, how far and how it ended. */
export function Attempts({ run }: { run: Run }) {
  if (!run.attempts || run.attempts.length <= 1) return null;
  return (
    <div className="card" data-testid="attempts">
      <h3>Attempts</h3>
      <table className="table">
        <thead><tr><th>#</th><th>state</th><th>worker</th><th>started</th><th>finished</th><th>last step</th><th>exit</th></tr></thead>
        <tbody>
          {run.attempts.map((a) => (
            <tr key={a.attempt}>
              <td>{a.attempt}</td><td>{a.state}</td><td>{a.worker ?? "–"}</td><td>{fmtTime(a.started_at)}</td>
              <td>{fmtTime(a.finished_at)}</td><td>{a.last_step}</td><td className="mono">{a.exit_reason ?? ""}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

/** Links to every stored point of the run, as CSV and Parquet. */
export function MetricsExport({ run }: { run: Run }) {
  return (
    <div className="buttons" data-testid="metrics-export">
      <span className="muted small">every stored point (step, rank, name, value, wall time):</span>
      <a className="button" href={withShare(`/api/runs/${run.id}/metrics.csv`)} download data-testid="download-metrics-csv">Download CSV</a>
      <a className="button" href={withShare(`/api/runs/${run.id}/metrics.parquet`)} download data-testid="download-metrics-parquet">Download Parquet</a>
    </div>
  );
}
