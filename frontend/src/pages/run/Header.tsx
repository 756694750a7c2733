import { useEffect, useState } from "react";
import { RunActions, StateBadge } from "../../components/RunActions";
import { gpuName, type Run } from "../../lib/api";
import { fmtDuration, fmtGiB, fmtGiBRange, fmtNum, fmtRange, fmtSeconds, fmtSeq, fmtTime } from "../../lib/format";
import { navigate } from "../../lib/route";
import { isTerminal } from "../../lib/states";
import { verdictBadge } from "../../lib/verdict";
import { LOAD_KEY } from "../planner/form";
import type { Store } from "./useRunData";

/** Seconds left and what they rest on: the steps to go times the median of the last ETA_WINDOW measured step times
 * (rank 0), so one slow step (a checkpoint save) does not swing it; before the first measured step, the planner's
 * predicted step time (`predictedStep`, the run's estimate). */
const ETA_WINDOW = 20;
export type Eta = { seconds: number; source: "measured" | "predicted" };
export function eta(store: Store, stepsLeft: number, predictedStep: number | null | undefined): Eta | null {
  if (stepsLeft <= 0) return null;
  const times = store.get("step_time_s")?.get(0);
  if (times && times.size > 0) {
    const recent = [...times.entries()].sort((a, b) => a[0] - b[0]).slice(-ETA_WINDOW).map(([, v]) => v).sort((a, b) => a - b);
    return { seconds: stepsLeft * recent[Math.floor(recent.length / 2)], source: "measured" };
  }
  return predictedStep ? { seconds: stepsLeft * predictedStep, source: "predicted" } : null;
}

function EtaText({ run, store, steps }: { run: Run; store: Store; steps: number }) {
  const e = eta(store, steps - (run.last_step ?? 0), run.estimate?.throughput?.step_time_s);
  return (
    <span>ETA <b data-testid="run-eta" data-source={e?.source ?? ""}>{fmtSeconds(e?.seconds)}</b>
      {e ? <span className="muted"> ({e.source === "measured" ? "measured steps" : "predicted step time"})</span> : null}</span>
  );
}

function modelName(run: Run): string {
  const m = run.spec?.model;
  if (!m) return "–";
  if (m.preset) return m.preset;
  const c = m.config as Record<string, unknown> | undefined;
  return c ? `custom (${c.num_hidden_layers ?? "?"}L, h${c.hidden_size ?? "?"})` : "–";
}

export function Header({ run, live, lastPointAt, onChange, store, viewOnly = false, shared = false }: {
  run: Run; live: string; lastPointAt: number | null; onChange: (r: Run) => void; store: Store; viewOnly?: boolean;
  shared?: boolean;  // opened by a share link: no planner either (it needs a sign-in)
}) {
  const [now, setNow] = useState(() => Date.now());  // "last point Ns ago" counts on every second
  useEffect(() => {
    const t = window.setInterval(() => setNow(Date.now()), 1000);
    return () => window.clearInterval(t);
  }, []);
  const s = run.spec;
  const steps = run.steps ?? (s.run?.steps as number | undefined) ?? null;
  const mem = run.estimate?.memory;
  return (
    <div className="card run-header" data-testid="run-header">
      <div className="row-between">
        <h2>
          <span className="muted">#{run.id}</span> {run.name || "(unnamed)"} <StateBadge run={run} testid="run-state" />
          {run.forced ? <span className="badge bad" title="approved although the estimate did not fit" data-testid="run-forced">forced</span> : null}
        </h2>
        {(run.alerts ?? []).length ? (
          <ul className="alerts" data-testid="run-alerts">
            {(run.alerts ?? []).map((a) => (
              <li key={a.kind} className="field-error" data-testid={`run-alert-${a.kind}`}>
                {a.message}{a.stopped ? " — the run was stopped (checkpoint saved on stop)" : ""}
              </li>
            ))}
          </ul>
        ) : null}
        <span className="actions">
          {shared ? null : (
            <button type="button" data-testid="open-in-planner" title="load this run's plan and run settings into the planner"
              onClick={() => { sessionStorage.setItem(LOAD_KEY, JSON.stringify(run.spec)); navigate("/planner"); }}>
              Open in planner
            </button>
          )}
          {viewOnly ? null : <RunActions run={run} onChange={onChange} />}
        </span>
      </div>
      <div className="kv">
        <span>model <b>{modelName(run)}</b></span>
        {run.device === "cpu"
          ? <span data-testid="run-device">ran on <b>CPU ranks × {(s.parallel?.sp_size ?? 1) * (s.parallel?.dp_size ?? 1)}</b> <span className="muted">(planned for {gpuName(s.hardware?.gpu)})</span></span>
          : <span data-testid="run-device">GPU <b>{gpuName(s.hardware?.gpu)} × {(s.hardware?.gpus_per_node ?? 0) * (s.hardware?.num_nodes ?? 1)}</b></span>}
        <span>seq_len <b>{s.training ? fmtSeq(s.training.seq_len) : "–"}</b></span>
        <span>sp × dp <b>{s.parallel?.sp_size} × {s.parallel?.dp_size}</b></span>
        <span>ZeRO <b>{s.training?.zero_stage}</b></span>
        <span>progress <b data-testid="run-progress">{run.last_step ?? 0} / {steps ?? "?"}</b></span>
        {run.state === "running" && steps ? <EtaText run={run} store={store} steps={steps} /> : null}
        {run.device === "cpu" ? null : (<>
          <span data-testid="run-predicted">predicted peak <b>{fmtGiB(mem?.peak_allocated_gib)}</b>
            {mem?.peak_allocated_gib_range ? <span className="muted"> ({fmtGiBRange(mem.peak_allocated_gib_range)})</span> : null}
            {mem?.verdict_label === "does not fit" ? <span className="badge bad" data-testid="run-does-not-fit"> does not fit</span> : null}
          </span>
          {mem?.verdict ? <span data-testid="run-verdict" data-verdict={mem.verdict}>
            <span className={`badge ${verdictBadge(mem).cls}`}>{mem.verdict_text}</span></span> : null}
          <span>predicted tokens/s <b>{fmtNum(run.estimate?.throughput?.tokens_per_s)}</b>
            {run.estimate?.throughput?.tokens_per_s_range ? <span className="muted" data-testid="run-tps-range"> ({fmtRange(run.estimate.throughput.tokens_per_s_range, (v) => fmtNum(v))})</span> : null}</span>
        </>)}
      </div>
      <div className="kv muted">
        <span>created {fmtTime(run.created_at)}</span>
        <span>approved {fmtTime(run.approved_at)}</span>
        <span>started {fmtTime(run.started_at)}</span>
        <span>finished {fmtTime(run.finished_at)}</span>
        <span>duration {fmtDuration(run.started_at, run.finished_at)}</span>
        <span>worker {run.worker ?? "–"} (attempt {run.attempt ?? 0})</span>
        {run.executor === "slurm" ? (
          <span data-testid="slurm-job">
            Slurm job <b>{run.slurm_job_id ?? "not submitted yet"}</b>
            {run.slurm_state ? ` ${run.slurm_state}` : ""}
            {run.slurm_reason && run.slurm_reason !== "None" ? ` (${run.slurm_reason})` : ""}
            {` on ${run.slurm_nodes ?? "–"}`}
          </span>
        ) : null}
        <span>heartbeat {fmtTime(run.heartbeat_at)}</span>
        {isTerminal(run.state) ? null : (
          <span data-testid="live-status" data-live={live}>
            stream {live}{lastPointAt ? `, last point ${Math.max(0, Math.round((now - lastPointAt) / 1000))}s ago` : ""}
          </span>
        )}
      </div>
      {steps ? (
        <div className="progress"><div style={{ width: `${Math.min(100, (100 * (run.last_step ?? 0)) / steps)}%` }} /></div>
      ) : null}
    </div>
  );
}
