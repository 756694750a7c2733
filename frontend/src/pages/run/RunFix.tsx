import { useQuery } from "@tanstack/react-query";
import { client, unwrap, type Plan, type Run } from "../../lib/api";
import { navigate } from "../../lib/route";
import { FixView } from "../planner/Advice";
import { LOAD_KEY } from "../planner/form";

/** The smallest change that would have fitted an OOM'd run, and a way to take it to the planner. */
export function RunFix({ run }: { run: Run }) {
  const { data: fix, error } = useQuery({
    queryKey: ["run-fix", run.id],
    queryFn: () => unwrap(client.GET("/api/runs/{run_id}/fix", { params: { path: { run_id: run.id } } })),
  });
  const open = (plan: Plan) => {
    sessionStorage.setItem(LOAD_KEY, JSON.stringify({ ...plan, run: run.spec.run }));
    navigate("/planner");
  };
  return (
    <div className="card warn" data-testid="run-fix-card">
      <h3>Smallest change that fits</h3>
      {error ? <div className="field-error">{error.message}</div> : fix ? <FixView fix={fix} onApply={open} testid="run-fix" /> : <div className="muted">…</div>}
    </div>
  );
}
