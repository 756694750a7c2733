import { useState } from "react";
import { ApiError, client, unwrap, unwrapRun, type Plan, type Run } from "../../lib/api";
import { isTerminal } from "../../lib/states";
import { can, useAuth } from "../../lib/auth";
import { fmtCount, fmtRange, sig } from "../../lib/format";

/** The stored result of a probe (plan/probe.py): measured per depth, extrapolated to the model's depth, predicted. */
type Figures = Record<string, number | null | undefined>;
type ProbeResult = {
  plan_depth: number; depths: number[]; device: string; run_id?: number;
  extrapolated: Figures; predicted: Figures & { peak_allocated_gib_range?: number[] | null };
  source: Record<string, string>; verdict: { text: string; fits: boolean | null }; warnings: string[];
  measured: { depth: number; status: string; reason?: string | null; step_time_s?: number | null }[];
};

const ROWS = [
  ["peak_allocated_gib", "peak allocated (GiB)"],
  ["reserved_gib", "reserved (GiB)"],
  ["device_total_gib", "nvidia-smi total (GiB)"],
  ["step_time_s", "step time (s)"],
  ["tokens_per_s", "tokens/s"],
] as const;

function fmt(x: number | null | undefined): string {
  return x === null || x === undefined ? "–" : Math.abs(x) >= 1000 ? fmtCount(x) : sig(x, 3);
}

function range(r: unknown): string {
  return Array.isArray(r) && r.length === 2 ? ` (${fmtRange(r as number[], fmt)})` : "";
}

/** "Measure this plan": stores the plan, queues a probe run (reduced depth, random weights, the plan's GPUs), waits
 * for it and shows what it measured beside the planner's prediction. */
export function ProbePanel({ plan, valid }: { plan: Plan | null; valid: boolean }) {
  const { identity } = useAuth();
  const [status, setStatus] = useState("");
  const [error, setError] = useState("");
  const [result, setResult] = useState<ProbeResult | null>(null);
  const [busy, setBusy] = useState(false);
  const measure = async () => {
    if (!plan) return;
    setBusy(true);
    setError("");
    setResult(null);
    try {
      const stored = await unwrap(client.POST("/api/plans", { body: { ...plan, run: null } }));
      const path = { plan_id: stored.id };
      let run: Run = await unwrapRun(client.POST("/api/plans/{plan_id}/probe", { params: { path }, body: {} }));
      setStatus(`probe run ${run.id}: ${run.state}`);
      while (!isTerminal(run.state)) {
        await new Promise((r) => setTimeout(r, 1000));
        run = await unwrapRun(client.GET("/api/runs/{run_id}", { params: { path: { run_id: run.id } } }));
        setStatus(`probe run ${run.id}: ${run.state}`);
      }
      if (run.state !== "succeeded") throw new Error(`probe run ${run.id} ended ${run.state}: ${run.exit_reason ?? ""}`);
      // the worker stores the result with the plan as the run ends; wait for this run's (a few seconds at most)
      let found: ProbeResult | null = null;
      for (let i = 0; i < 30 && !found; i++) {
        const probe = (await unwrap(client.GET("/api/plans/{plan_id}", { params: { path } }))).probe as ProbeResult | null | undefined;
        if (probe && probe.run_id === run.id) found = probe;
        else await new Promise((r) => setTimeout(r, 1000));
      }
      if (!found) throw new Error(`probe run ${run.id} succeeded but left no result with the plan`);
      setResult(found);
    } catch (e) {
      setError(e instanceof ApiError ? e.message : String(e));
    } finally {
      setBusy(false);
    }
  };
  return (
    <div className="card" data-testid="probe-panel">
      <h3>Measure this plan</h3>
      <div className="muted small">Trains the plan for a few steps at 1, 2 and 4 layers with random weights on its own GPUs, and extrapolates to the model's depth.</div>
      <button type="button" data-testid="probe-plan" disabled={!plan || !valid || busy || !can(identity, "submit")} onClick={measure}>
        {busy ? "Measuring…" : "Measure this plan"}
      </button>
      {status ? <div className="muted small" data-testid="probe-status">{status}</div> : null}
      {error ? <div className="field-error" data-testid="probe-error">{error}</div> : null}
      {result ? (
        <div data-testid="probe-result">
          <div className={result.verdict.fits === false ? "field-error" : ""} data-testid="probe-verdict"><b>{result.verdict.text}</b></div>
          <table className="table small">
            <thead><tr><th></th><th>measured on {result.device === "cuda" ? "the plan's GPUs" : "CPU ranks"} ({result.plan_depth} layers)</th><th>predicted</th></tr></thead>
            <tbody>
              {ROWS.map(([k, label]) => (
                <tr key={k} data-testid={`probe-row-${k}`}>
                  <td>{label}</td>
                  <td>{fmt(result.extrapolated[k])} <span className="muted">{result.source[k] ?? ""}</span></td>
                  <td>{result.device === "cuda" ? <>{fmt(result.predicted[k])}{range(result.predicted[`${k}_range`])}</> : "no CPU prediction"}</td>
                </tr>
              ))}
            </tbody>
          </table>
          <div className="muted small">depths {result.measured.map((m) => `${m.depth} (${m.status})`).join(", ")} on {result.device === "cuda" ? "GPUs" : "CPU ranks"}</div>
          {result.warnings.map((w, i) => <div key={i} className="muted small">⚠ {w}</div>)}
        </div>
      ) : null}
    </div>
  );
}
