import { keepPreviousData, useMutation, useQuery } from "@tanstack/react-query";
import { useState } from "react";
import { CheckpointDownload } from "../../components/CheckpointDownload";
import { client, unwrap, unwrapRun, type Run } from "../../lib/api";
import { can, useAuth } from "../../lib/auth";
import { fmtGiB, fmtTime, fmtValue } from "../../lib/format";
import { isUnfinished } from "../../lib/states";
import type { components } from "../../lib/schema";

type RetryIn = components["schemas"]["RetryIn"];

/** The checkpoints on disk, those from before a divergence first (each group newest first), the ones whose step's loss
 * had diverged (a stop's) labelled so: Retry resumes a failed or stopped run from the newest, "resume from here"
 * from the one chosen (its newer checkpoints are moved aside, not deleted). */
export function Checkpoints({ run, onChange }: { run: Run; onChange: (r: Run) => void }) {
  const { identity } = useAuth();
  const [asking, setAsking] = useState<string | null>(null);
  const section = (run.spec?.run ?? {}) as { learning_rate?: number; lr_scheduler?: string };
  const [lr, setLr] = useState(String(section.learning_rate ?? ""));
  const [schedule, setSchedule] = useState(String(section.lr_scheduler ?? "constant"));
  // read again as the run moves on (a new checkpoint every checkpoint_every steps) and when it ends
  const listed = useQuery({
    queryKey: ["checkpoints", run.id, run.state, run.last_step],
    queryFn: () => unwrap(client.GET("/api/runs/{run_id}/checkpoints", { params: { path: { run_id: run.id } } })),
    placeholderData: keepPreviousData,
  });
  const resume = useMutation({
    mutationFn: async (ref: string) => {
      const rate = Number(lr);
      if (!(rate > 0)) throw new Error(`learning rate: ${JSON.stringify(lr)} is not a positive number`);
      return unwrapRun(client.POST("/api/runs/{run_id}/retry", {
        params: { path: { run_id: run.id } },
        body: { from_checkpoint: ref, learning_rate: rate, lr_scheduler: schedule as RetryIn["lr_scheduler"] },
      }));
    },
    onSuccess: (r) => {
      onChange(r);
      setAsking(null);
    },
  });
  if (listed.error) {
    return <div className="card field-error" data-testid="checkpoints-error">Checkpoints: {listed.error.message}</div>;
  }
  const rows = listed.data;
  if (!rows || rows.length === 0) return null;
  const retryable = isUnfinished(run.state) && Boolean(run.approved_at) && can(identity, "approve");
  const error = resume.error?.message ?? "";
  return (
    <div className="card" data-testid="run-checkpoints">
      <h3>Checkpoints <span className="muted small">(from before a divergence first; Retry resumes from the newest)</span></h3>
      <table className="table">
        <thead><tr><th>stage</th><th>step</th><th>loss</th><th>size</th><th>saved</th><th></th></tr></thead>
        <tbody>
          {rows.map((c) => {
            const ref = `${c.stage}/checkpoint-${c.step}`;
            return (
              <tr key={ref} data-testid={`checkpoint-${c.stage}-${c.step}`} data-diverged={c.diverged ? "1" : "0"}>
                <td>{c.stage}</td>
                <td>{c.step}{c.diverged ? <span className="badge warn" data-testid={`checkpoint-diverged-${c.stage}-${c.step}`}> diverged</span> : null}</td>
                <td>{c.loss == null ? "–" : fmtValue(c.loss)}</td>
                <td>{fmtGiB(c.bytes / 2 ** 30)}</td><td>{fmtTime(c.saved_at)}</td>
                <td>
                  {c.complete !== false ? <CheckpointDownload runId={run.id} stage={c.stage} step={c.step} /> : null}{" "}
                  {retryable && c.complete !== false && asking !== ref ? (
                    <button type="button" data-testid={`resume-from-${c.stage}-${c.step}`} onClick={() => setAsking(ref)}>
                      Resume from here
                    </button>
                  ) : null}
                  {asking === ref ? (
                    <span className="confirm" data-testid={`resume-confirm-${c.stage}-${c.step}`}>
                      A new attempt resumes from step {c.step}; newer checkpoints are moved aside.
                      {c.diverged ? " Its loss had diverged: the divergence rule holds the new attempt to the run's lowest loss before it." : null}
                      <label className="field inline"><span className="field-label">learning rate</span>
                        <input data-testid="resume-lr" value={lr} onChange={(e) => setLr(e.target.value)} /></label>
                      <label className="field inline"><span className="field-label">schedule</span>
                        <select data-testid="resume-lr_scheduler" value={schedule} onChange={(e) => setSchedule(e.target.value)}>
                          {["constant", "linear", "cosine"].map((v) => <option key={v}>{v}</option>)}
                        </select></label>
                      <button type="button" className="primary" data-testid={`resume-yes-${c.stage}-${c.step}`} disabled={resume.isPending}
                        onClick={() => resume.mutate(ref)}>Resume</button>
                      <button type="button" onClick={() => setAsking(null)}>Keep as is</button>
                    </span>
                  ) : null}
                </td>
              </tr>
            );
          })}
        </tbody>
      </table>
      {run.resume_from ? <div className="muted small" data-testid="run-resume-from">attempt {run.attempt} resumes from {run.resume_from}</div> : null}
      {error ? <div className="field-error" data-testid="resume-error">{error}</div> : null}
    </div>
  );
}
