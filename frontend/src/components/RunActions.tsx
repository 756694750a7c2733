import { useState } from "react";
import { api, ApiError, TERMINAL, type Run, type RunSection } from "../lib/api";
import { can, canCancel, useAuth } from "../lib/auth";
import { navigate } from "../lib/route";

/** Approve / cancel / retry, each shown only where the state and the signed-in role allow it. */
export function RunActions({ run, onChange, compact }: { run: Run; onChange: (r: Run) => void; compact?: boolean }) {
  const { identity } = useAuth();
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState("");
  const [needsForce, setNeedsForce] = useState(false);
  const [confirming, setConfirming] = useState(false);  // cancel asks once before it stops anything
  const act = async (fn: () => Promise<Run>, after?: (r: Run) => void) => {
    setBusy(true);
    setError("");
    try {
      const r = await fn();
      setNeedsForce(false);
      onChange(r);
      after?.(r);
    } catch (e) {
      setError((e as Error).message);
      // 409 on approve: the estimate does not fit; an approver may still force it (recorded on the run).
      if (e instanceof ApiError && e.status === 409 && e.fields.some((f) => f.field.startsWith("estimate"))) setNeedsForce(true);
    } finally {
      setBusy(false);
    }
  };
  const terminal = TERMINAL.includes(run.state);
  const ended = ["failed", "oom", "lost", "cancelled", "stopped"].includes(run.state);
  // a run never approved is not retried (the API's queue gate answers 409): it is submitted anew
  const retryable = ended && Boolean(run.approved_at);
  const id = run.id;
  return (
    <span className={`actions ${compact ? "compact" : ""}`}>
      {run.state === "pending_approval" && can(identity, "approve") ? (
        <button type="button" className="primary" data-testid={`approve-${id}`} disabled={busy}
          onClick={() => act(() => api.approve(id))}>Approve</button>
      ) : null}
      {needsForce && run.state === "pending_approval" ? (
        <button type="button" className="danger" data-testid={`approve-force-${id}`} disabled={busy}
          onClick={() => act(() => api.approve(id, true))}>Approve anyway</button>
      ) : null}
      {!terminal && canCancel(identity, run) && !confirming ? (
        <button type="button" className="danger" data-testid={`cancel-${id}`} disabled={busy || run.cancel_requested}
          onClick={() => setConfirming(true)}>{run.cancel_requested ? "Cancelling…" : "Cancel"}</button>
      ) : null}
      {!terminal && confirming ? (
        <span className="confirm" data-testid={`cancel-confirm-${id}`}>
          {run.started_at ? "Stop this run? It saves a checkpoint first; Retry resumes from it." : "Cancel this run before it starts?"}
          <button type="button" className="danger" data-testid={`confirm-cancel-${id}`} disabled={busy}
            onClick={() => act(() => api.cancel(id), () => setConfirming(false))}>Yes, cancel</button>
          <button type="button" data-testid={`keep-${id}`} onClick={() => setConfirming(false)}>Keep it</button>
        </span>
      ) : null}
      {retryable && can(identity, "approve") ? (
        <button type="button" data-testid={`retry-${id}`} disabled={busy} title="next attempt of this run, resuming from its last checkpoint"
          onClick={() => act(() => api.retry(id))}>
          Retry
        </button>
      ) : null}
      {ended && can(identity, "submit") && !(retryable && can(identity, "approve")) ? (
        <button type="button" data-testid={`resubmit-${id}`} disabled={busy} title="a new run from the same plan (waits for approval)"
          onClick={() => run.plan_id !== null && run.spec.run && act(() => api.createRun(run.plan_id as number, run.spec.run as RunSection, run.name), (r) => navigate(`/runs/${r.id}`))}>
          Resubmit
        </button>
      ) : null}
      {error ? <span className="field-error" data-testid={`action-error-${id}`}>{error}</span> : null}
    </span>
  );
}

export function StateBadge({ run, testid }: { run: Run; testid?: string }) {
  return (
    <span className={`state state-${run.state}`} data-testid={testid} data-state={run.state}>
      {run.state.replace(/_/g, " ")}
      {run.cancel_requested && !TERMINAL.includes(run.state) ? " (cancel requested)" : ""}
    </span>
  );
}
