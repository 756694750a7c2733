import { useQuery } from "@tanstack/react-query";
import { client, unwrap, type StoredPlan } from "../lib/api";
import { fmtTime } from "../lib/format";
import { encodePlanParam } from "./planner/form";

/** The stored plans, newest first (GET /api/plans): each with its estimate's verdict, and a link that opens it in the
 * planner. A plan is stored only when it is valid (with a run submitted from it, or saved through the API). */
export function Plans() {
  const { data: plans, error } = useQuery({
    queryKey: ["plans"],
    queryFn: () => unwrap(client.GET("/api/plans")) as Promise<StoredPlan[]>,
  });
  if (error) return <div className="card field-error" data-testid="plans-error">{error.message}</div>;
  if (!plans) return <div className="card muted">loading…</div>;
  return (
    <div className="card" data-testid="plans">
      <h2>Plans</h2>
      {plans.length === 0 ? <div className="muted">No plans stored yet: submit a run from the planner.</div> : (
        <table className="table">
          <thead><tr><th>#</th><th>name</th><th>model</th><th>GPUs</th><th>seq_len</th><th>sp × dp</th><th>per-GPU memory</th><th>stored</th><th></th></tr></thead>
          <tbody>
            {plans.map((p) => {
              const m = p.plan.model as { preset?: string; config?: { model_type?: string } };
              const hw = p.plan.hardware;
              const mem = p.estimate.memory;
              return (
                <tr key={p.id} data-testid={`plan-row-${p.id}`}>
                  <td>{p.id}</td>
                  <td>{p.name || <span className="muted">(unnamed)</span>}</td>
                  <td>{m.preset ?? `custom ${m.config?.model_type ?? ""}`}</td>
                  <td>{hw.num_nodes ?? 1} × {hw.gpus_per_node} {typeof hw.gpu === "string" ? hw.gpu : hw.gpu.name}</td>
                  <td>{p.plan.training?.seq_len}</td>
                  <td>{p.plan.parallel?.sp_size} × {p.plan.parallel?.dp_size}</td>
                  <td>{mem ? <span className={`badge ${mem.fits ? "ok" : "bad"}`}>{mem.device_total_gib} GiB {mem.fits ? "fits" : "does not fit"}</span> : null}</td>
                  <td>{fmtTime(p.created_at)}</td>
                  <td><a href={`#/planner?plan=${encodePlanParam(p.plan)}`} data-testid={`plan-open-${p.id}`}>Open in planner</a></td>
                </tr>
              );
            })}
          </tbody>
        </table>
      )}
    </div>
  );
}
