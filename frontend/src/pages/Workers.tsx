import { useQuery } from "@tanstack/react-query";
import { client, unwrap, type WorkerInfo } from "../lib/api";

const LIBS: [string, string][] = [
  ["torch", "torch"], ["cuda", "CUDA"], ["deepspeed", "DeepSpeed"], ["transformers", "Transformers"],
  ["accelerate", "Accelerate"], ["flash_attn", "flash-attn 2"], ["flash_attn_3", "flash-attn 3"], ["liger_kernel", "Liger"],
];

function stateText(w: WorkerInfo): string {
  if (w.stopped_at) return `stopped ${new Date(w.stopped_at).toLocaleString()}`;
  const last = new Date(w.heartbeat_at ?? w.started_at).toLocaleString();
  return w.state === "lost" ? `lost: no heartbeat since ${last}` : `up since ${new Date(w.started_at).toLocaleString()}`;
}

/** What each worker reported it can run when it started: library versions, attention kernels, GPU model. Approval
 * refuses a run whose attention kernel or Liger no running worker of its queue has. */
export function WorkersPage() {
  const { data: workers, error } = useQuery({ queryKey: ["workers"], queryFn: () => unwrap(client.GET("/api/workers")) });
  if (error) return <div className="card error">Could not load workers: {error.message}</div>;
  if (!workers) return <div className="muted">loading workers…</div>;
  return (
    <div data-testid="workers-page">
      <div className="card">
        <h2>Workers</h2>
        <div className="muted">What each worker reported when it started. Approving a run checks that a running worker of
          its queue has the plan's attention kernel (training.attn_implementation) and Liger; a worker without a GPU runs
          every attention as sdpa. A worker whose heartbeat stopped (killed without shutting down) is lost: its kernels
          no longer count, for approval or for recommendations.</div>
      </div>
      <div className="card">
        {workers.length === 0 ? <div className="muted">No worker has reported yet.</div> : (
          <div className="table-wrap">
            <table data-testid="workers-table">
              <thead>
                <tr><th>worker</th><th>state</th><th>queues</th><th>GPU</th>{LIBS.map(([k, label]) => <th key={k}>{label}</th>)}
                  <th>attention kernels</th></tr>
              </thead>
              <tbody>
                {workers.map((w) => (
                  <tr key={w.name} data-testid="worker-row" data-state={w.state} className={w.state === "up" ? "" : "muted"}>
                    <td className="mono">{w.name}</td>
                    <td>{stateText(w)}</td>
                    <td className="mono">{w.queues.join(", ")}</td>
                    <td>{w.gpu_model ? `${w.gpu_count} × ${w.gpu_model}` : "no GPU (CPU ranks)"}</td>
                    {LIBS.map(([k]) => <td key={k} className="mono">{w.versions[k] ?? "–"}</td>)}
                    <td className="mono">{w.attn_implementations.join(", ")}</td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
        )}
      </div>
    </div>
  );
}
