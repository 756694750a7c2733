import { useState } from "react";
import { readViewOnly } from "../../lib/chartState";
import { readShareToken } from "../../lib/share";
import { Checkpoints } from "./Checkpoints";
import { Attempts, ErrorPanel, MetricsExport } from "./Failure";
import { Header } from "./Header";
import { Labels } from "./Labels";
import { LogView } from "./LogView";
import { RunCharts } from "./RunCharts";
import { RunFix } from "./RunFix";
import { Timeline } from "./Timeline";
import { useRunData } from "./useRunData";

/** The run page: one panel per file under pages/run/, each reading what it shows (the run itself comes live from
 * useRunData: its query, kept current by the stream). */
export function RunPage({ id }: { id: number }) {
  const { run, setRun, error, historyError, store, live, zoom, setZoom, lastPointAt } = useRunData(id);
  // a share link (lib/share.ts) opens the page for someone who may have no account: its token reads the run, its
  // timeline and metrics, nothing else (no log, no checkpoint, no planner)
  const [shared] = useState(() => readShareToken() !== null);
  const [viewOnly] = useState(() => shared || readViewOnly());  // the run and its charts, no button that changes it
  if (error && !run) return <div className="card error" data-testid="run-load-error">Run {id}: {error}</div>;
  if (!run) return <div className="muted">loading run {id}…</div>;
  return (
    <div className="run-page" data-testid="run-page" data-run-id={run.id}>
      {shared ? <div className="card muted" data-testid="shared-view">A shared view-only link: this page shows the run,
        its alerts and its charts, and nothing on it changes the run.</div>
        : viewOnly ? <div className="card muted" data-testid="view-only">A view-only link: this page shows the run and its
        charts as they were shared; <a href={`#/runs/${run.id}`}>open the full page</a> to act on the run.</div> : null}
      <Header run={run} live={live} lastPointAt={lastPointAt} onChange={setRun} store={store} viewOnly={viewOnly}
        shared={shared} />
      {viewOnly ? null : <Labels key={run.id} run={run} onChange={setRun} />}
      <Timeline run={run} />
      {viewOnly ? null : <Checkpoints run={run} onChange={setRun} />}
      <ErrorPanel run={run} />
      {run.state === "oom" && !viewOnly ? <RunFix run={run} /> : null}
      <Attempts run={run} />
      <MetricsExport run={run} />
      {historyError ? <div className="card field-error" data-testid="metrics-error">Metrics: {historyError}</div> : null}
      <RunCharts run={run} store={store} zoom={zoom} setZoom={setZoom} />
      {shared ? null : <LogView run={run} />}
      <details className="card">
        <summary>Spec (plan + run)</summary>
        <pre className="export" data-testid="run-spec">{JSON.stringify(run.spec, null, 2)}</pre>
      </details>
    </div>
  );
}
