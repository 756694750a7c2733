import { useMutation } from "@tanstack/react-query";
import { useState } from "react";
import { ApiError, client, unwrapRun, type Run } from "../lib/api";
import { can, canCancel, useAuth } from "../lib/auth";
import { navigate } from "../lib/route";
import { isTerminal, isUnfinished } from "../lib/states";

type Action = { call: () => Promise<Run>; after?: (r: Run) => void };

/** Approve / cancel / retry, each shown only where the state and the signed-in role allow it. */
export function RunActions({ run, onChange, compact }: { run: Run; onChange: (r: Run) => void; compact?: boolean }) {
  const { identity } = useAuth();
  const [needsForce, setNeedsForce] = useState(false);
  const [confirming, setConfirming] = useState(false);  // cancel asks once before it stops anything
  const action = useMutation({
    mutationFn: ({ call }: Action) => call(),
    onSuccess: (r, { after }) => {
      setNeedsForce(false);
      onChange(r);
      after?.(r);
    },
    // 409 on approve: the estimate does not fit; an approver may still force it (recorded on the run).
    onError: (e) => {
      if (e instanceof ApiError && e.status === 409 && e.fields.some((f) => f.field.startsWith("estimate"))) setNeedsForce(true);
    },
  });
  const act = (call: () => Promise<Run>, after?: (r: Run) => void) => action.mutate({ call, after });
  const busy = action.isPending;
  const error = action.error?.message ?? "";
  const path = { run_id: run.id };
  const terminal = isTerminal(run.state);
  const ended = isUnfinished(run.state);
  // a run never approved is not retried (the API's queue gate answers 409): it is submitted anew
  const retryable = ended && Boolean(run.approved_at);
  const id = run.id;
  return (
    <span className={`actions ${compact ? "compact" : ""}`}>
      {run.state === "pending_approval" && can(identity, "approve") ? (
        <button type="button" className="primary" data-testid={`approve-${id}`} disabled={busy}
          onClick={() => act(() => unwrapRun(client.POST("/api/runs/{run_id}/approve", { params: { path } })))}>Approve</button>
      ) : null}
      {needsForce && run.state === "pending_approval" ? (
        <button type="button" className="danger" data-testid={`approve-force-${id}`} disabled={busy}
          onClick={() => act(() => unwrapRun(client.POST("/api/runs/{run_id}/approve", { params: { path, query: { force: true } } })))}>Approve anyway</button>
      ) : null}
      {!terminal && canCancel(identity, run) && !confirming ? (
        <button type="button" className="danger" data-testid={`cancel-${id}`} disabled={busy || run.cancel_requested}
          onClick={() => setConfirming(true)}>{run.cancel_requested ? "Cancelling…" : "Cancel"}</button>
      ) : null}
      {!terminal && confirming ? (
        <span className="confirm" data-testid={`cancel-confirm-${id}`}>
          {run.started_at ? "Stop this run? It saves a checkpoint first; Retry resumes from it." : "Cancel this run before it starts?"}
          <button type="button" className="danger" data-testid={`confirm-cancel-${id}`} disabled={busy}
            onClick={() => act(() => unwrapRun(client.POST("/api/runs/{run_id}/cancel", { params: { path } })), () => setConfirming(false))}>Yes, cancel</button>
          <button type="button" data-testid={`keep-${id}`} onClick={() => setConfirming(false)}>Keep it</button>
        </span>
      ) : null}
      {retryable && can(identity, "approve") ? (
        <button type="button" data-testid={`retry-${id}`} disabled={busy} title="next attempt of this run, resuming from its last checkpoint"
          onClick={() => act(() => unwrapRun(client.POST("/api/runs/{run_id}/retry", { params: { path } })))}>
          Retry
        </button>
      ) : null}
      {ended && can(identity, "submit") && !(retryable && can(identity, "approve")) ? (
        <button type="button" data-testid={`resubmit-${id}`} disabled={busy} title="a new run from the same plan (waits for approval)"
          onClick={() => {
            const [planId, section] = [run.plan_id, run.spec.run];
            if (planId == null || !section) return;
            act(() => unwrapRun(client.POST("/api/runs", { body: { plan_id: planId, run: section, name: run.name } })),
              (r) => navigate(`/runs/${r.id}`));
          }}>
          Resubmit
        </button>
      ) : null}
      {error ? <span className="field-error" data-testid={`action-error-${id}`}>{error}</span> : null}
    </span>
  );
}

/** The run's state, and beside it the alerts of its last attempt that did not stop it: a run that ends with one is
 * not plain "succeeded". */
export function StateBadge({ run, testid }: { run: Run; testid?: string }) {
  const open = run.open_alerts ?? [];
  return (
    <>
      <span className={`state state-${run.state}`} data-testid={testid} data-state={run.state}>
        {run.state.replace(/_/g, " ")}
        {run.cancel_requested && !isTerminal(run.state) ? " (cancel requested)" : ""}
      </span>
      {open.length ? (
        <span className="badge warn state-alert" data-testid={testid ? `${testid}-alert` : undefined} title={open.map((a) => a.message).join("\n")}>
          alert: {open.map((a) => `${a.kind.replace(/_/g, " ")} at step ${a.step}`).join(", ")}
        </span>
      ) : null}
    </>
  );
}
