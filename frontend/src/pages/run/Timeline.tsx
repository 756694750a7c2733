import { keepPreviousData, useQuery } from "@tanstack/react-query";
import { client, unwrap, type Run } from "../../lib/api";
import { fmtTime } from "../../lib/format";

const EVENT_LABEL: Record<string, string> = {
  submitted: "submitted", approved: "approved", attempt_started: "attempt started", attempt_ended: "attempt ended",
  alert: "alert", changed: "changed",
};

/** What happened to the run, oldest first (GET /api/runs/{id}/events): read again when its state or alerts change. */
export function Timeline({ run }: { run: Run }) {
  const alerts = (run.alerts ?? []).length;
  // Keyed by what changes the timeline: a read started before the latest change (an alert, then the end) may answer
  // after it, into its own key, so only the newest counts; the last answer stays shown until the next arrives.
  const read = useQuery({
    queryKey: ["events", run.id, run.state, run.attempt, alerts],
    queryFn: () => unwrap(client.GET("/api/runs/{run_id}/events", { params: { path: { run_id: run.id } } })),
    placeholderData: keepPreviousData,
  });
  if (read.error) return <div className="card field-error" data-testid="timeline-error">Timeline: {read.error.message}</div>;
  const events = read.data;
  if (!events || events.length === 0) return null;
  return (
    <div className="card" data-testid="run-timeline">
      <h3>Timeline</h3>
      <ol className="timeline">
        {events.map((e, i) => (
          <li key={i} className={e.kind === "alert" ? "field-error" : undefined} data-testid={`event-${e.kind}`}>
            <span className="muted small">{fmtTime(e.at)}</span>{" "}
            <b>{EVENT_LABEL[e.kind] ?? e.kind}</b>
            {e.attempt ? ` #${e.attempt}` : ""}
            {e.step !== null && e.step !== undefined ? ` at step ${e.step}` : ""}
            {e.state ? ` (${e.state})` : ""}
            {e.kind === "alert" && e.stopped ? " — stopped the run" : ""}
            {e.message ? <span className="mono small">: {e.message}</span> : null}
          </li>
        ))}
      </ol>
    </div>
  );
}
