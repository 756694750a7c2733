import { useEffect, useMemo, useRef, useState } from "react";
import { CheckpointDownload } from "../../components/CheckpointDownload";
import { RunActions, StateBadge } from "../../components/RunActions";
import { api, gpuName, type Fix, type Plan, type Run, type RunEvent } from "../../lib/api";
import { can, useAuth } from "../../lib/auth";
import { fmtDuration, fmtGiB, fmtNum, fmtSeconds, fmtSeq, fmtTime } from "../../lib/format";
import { rangeText, verdictBadge, verdictWords } from "../../lib/verdict";
import { navigate } from "../../lib/route";
import { FixView } from "../planner/Advice";
import { LOAD_KEY } from "../planner/form";
import { RunCharts } from "./RunCharts";
import { useRunData, type Store } from "./useRunData";

/** Seconds left: the steps to go times the median of the last ETA_WINDOW measured step times (rank 0), so one slow
 * step (a checkpoint save) does not swing it. */
const ETA_WINDOW = 20;
export function etaSeconds(store: Store, stepsLeft: number): number | null {
  const times = store.get("step_time_s")?.get(0);
  if (!times || times.size === 0 || stepsLeft <= 0) return null;
  const recent = [...times.entries()].sort((a, b) => a[0] - b[0]).slice(-ETA_WINDOW).map(([, v]) => v).sort((a, b) => a - b);
  return stepsLeft * recent[Math.floor(recent.length / 2)];
}

function modelName(run: Run): string {
  const m = run.spec?.model;
  if (!m) return "–";
  if (m.preset) return m.preset;
  const c = m.config as Record<string, unknown> | undefined;
  return c ? `custom (${c.num_hidden_layers ?? "?"}L, h${c.hidden_size ?? "?"})` : "–";
}

/** The checkpoints on disk, newest first: Retry resumes a failed or stopped run from the newest, "resume from here"
 * from the one chosen (its newer checkpoints are moved aside, not deleted). */
function Checkpoints({ run, onChange }: { run: Run; onChange: (r: Run) => void }) {
  const { identity } = useAuth();
  const [rows, setRows] = useState<{ stage: string; step: number; bytes: number; saved_at: string; complete?: boolean }[] | null>(null);
  const [asking, setAsking] = useState<string | null>(null);
  const [error, setError] = useState("");
  const section = (run.spec?.run ?? {}) as { learning_rate?: number; lr_scheduler?: string };
  const [lr, setLr] = useState(String(section.learning_rate ?? ""));
  const [schedule, setSchedule] = useState(String(section.lr_scheduler ?? "constant"));
  useEffect(() => {
    api.checkpoints(run.id).then(setRows).catch(() => setRows([]));
  }, [run.id, run.state, run.last_step]);
  if (!rows || rows.length === 0) return null;
  const retryable = ["failed", "oom", "lost", "cancelled", "stopped"].includes(run.state) && Boolean(run.approved_at) &&
    can(identity, "approve");
  const resume = async (ref: string) => {
    setError("");
    try {
      const rate = Number(lr);
      if (!(rate > 0)) throw new Error(`learning rate: ${JSON.stringify(lr)} is not a positive number`);
      onChange(await api.retryFrom(run.id, ref, { learning_rate: rate, lr_scheduler: schedule }));
      setAsking(null);
    } catch (e) {
      setError((e as Error).message);
    }
  };
  return (
    <div className="card" data-testid="run-checkpoints">
      <h3>Checkpoints <span className="muted small">(newest first; Retry resumes from the newest)</span></h3>
      <table className="table">
        <thead><tr><th>stage</th><th>step</th><th>size</th><th>saved</th><th></th></tr></thead>
        <tbody>
          {rows.map((c) => {
            const ref = `${c.stage}/checkpoint-${c.step}`;
            return (
              <tr key={ref} data-testid={`checkpoint-${c.stage}-${c.step}`}>
                <td>{c.stage}</td><td>{c.step}</td><td>{fmtGiB(c.bytes / 2 ** 30)}</td><td>{fmtTime(c.saved_at)}</td>
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
                      <label className="field inline"><span className="field-label">learning rate</span>
                        <input data-testid="resume-lr" value={lr} onChange={(e) => setLr(e.target.value)} /></label>
                      <label className="field inline"><span className="field-label">schedule</span>
                        <select data-testid="resume-lr_scheduler" value={schedule} onChange={(e) => setSchedule(e.target.value)}>
                          {["constant", "linear", "cosine"].map((v) => <option key={v}>{v}</option>)}
                        </select></label>
                      <button type="button" className="primary" data-testid={`resume-yes-${c.stage}-${c.step}`} onClick={() => resume(ref)}>Resume</button>
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

const EVENT_LABEL: Record<string, string> = {
  submitted: "submitted", approved: "approved", attempt_started: "attempt started", attempt_ended: "attempt ended",
  alert: "alert", changed: "changed",
};

/** What happened to the run, oldest first (GET /api/runs/{id}/events): read again when its state or alerts change. */
function Timeline({ run }: { run: Run }) {
  const [events, setEvents] = useState<RunEvent[] | null>(null);
  const alerts = (run.alerts ?? []).length;
  useEffect(() => {
    // a read started before the latest change (an alert, then the end) may answer after it: only the newest counts
    let current = true;
    api.events(run.id).then((e) => current && setEvents(e)).catch(() => current && setEvents([]));
    return () => { current = false; };
  }, [run.id, run.state, run.attempt, alerts]);
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

/** Tags (comma-separated) and notes a person keeps on a run; saved with PATCH /api/runs/{id}. */
function Labels({ run, onChange }: { run: Run; onChange: (r: Run) => void }) {
  const [tags, setTags] = useState((run.tags ?? []).join(", "));
  const [notes, setNotes] = useState(run.notes ?? "");
  const [msg, setMsg] = useState("");
  const save = async () => {
    try {
      onChange(await api.label(run.id, { tags: tags.split(",").map((t) => t.trim()).filter(Boolean), notes }));
      setMsg("saved");
    } catch (e) {
      setMsg((e as Error).message);
    }
  };
  return (
    <div className="card" data-testid="run-labels">
      <h3>Tags and notes</h3>
      <label className="field"><span className="field-label">tags (comma-separated)</span>
        <input data-testid="run-tags-input" value={tags} onChange={(e) => setTags(e.target.value)} placeholder="baseline, 64k" /></label>
      <label className="field"><span className="field-label">notes</span>
        <textarea data-testid="run-notes-input" value={notes} onChange={(e) => setNotes(e.target.value)} rows={3} /></label>
      <button type="button" data-testid="run-labels-save" onClick={save}>Save</button>
      {msg ? <span className="muted small" data-testid="run-labels-status"> {msg}</span> : null}
    </div>
  );
}

function Header({ run, live, lastPointAt, onChange, store }: { run: Run; live: string; lastPointAt: number | null; onChange: (r: Run) => void; store: Store }) {
  const [, tick] = useState(0);
  useEffect(() => {
    const t = window.setInterval(() => tick((n) => n + 1), 1000);
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
          <button type="button" data-testid="open-in-planner" title="load this run's plan and run settings into the planner"
            onClick={() => { sessionStorage.setItem(LOAD_KEY, JSON.stringify(run.spec)); navigate("/planner"); }}>
            Open in planner
          </button>
          <RunActions run={run} onChange={onChange} />
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
        {run.state === "running" && steps ? (
          <span>ETA <b data-testid="run-eta">{fmtSeconds(etaSeconds(store, steps - (run.last_step ?? 0)))}</b></span>
        ) : null}
        {run.device === "cpu" ? null : (<>
          <span data-testid="run-predicted">predicted peak <b>{fmtGiB(mem?.peak_allocated_gib)}</b>
            {mem?.peak_allocated_gib_range ? <span className="muted"> ({rangeText(mem.peak_allocated_gib_range, (v) => v.toFixed(1))} GiB)</span> : null}
            {mem && (mem.verdict === "does_not_fit" || !mem.cpu_fits) ? <span className="badge bad" data-testid="run-does-not-fit"> does not fit</span> : null}
          </span>
          {mem?.verdict ? <span data-testid="run-verdict" data-verdict={mem.verdict}>
            <span className={`badge ${verdictBadge(mem).cls}`}>{verdictWords(mem)}</span></span> : null}
          <span>predicted tokens/s <b>{fmtNum(run.estimate?.throughput?.tokens_per_s)}</b>
            {run.estimate?.throughput?.tokens_per_s_range ? <span className="muted" data-testid="run-tps-range"> ({rangeText(run.estimate.throughput.tokens_per_s_range, (v) => fmtNum(v))})</span> : null}</span>
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
        {TERMINAL_STATES.includes(run.state) ? null : (
          <span data-testid="live-status" data-live={live}>
            stream {live}{lastPointAt ? `, last point ${Math.round((Date.now() - lastPointAt) / 1000)}s ago` : ""}
          </span>
        )}
      </div>
      {steps ? (
        <div className="progress"><div style={{ width: `${Math.min(100, (100 * (run.last_step ?? 0)) / steps)}%` }} /></div>
      ) : null}
    </div>
  );
}

const TERMINAL_STATES = ["succeeded", "failed", "oom", "cancelled", "lost", "stopped"];

/** The trainer log: every line, one rank's (torchrun tags each with [rankN]:) or the launcher's, searched, and
 * downloaded whole. Polled while the run is active. */
function LogView({ run }: { run: Run }) {
  const ranks = (run.spec.parallel?.sp_size ?? 1) * (run.spec.parallel?.dp_size ?? 1);
  const [source, setSource] = useState("all");
  const [query, setQuery] = useState("");
  const [lines, setLines] = useState<string[] | null>(null);
  const pre = useRef<HTMLPreElement>(null);
  const terminal = TERMINAL_STATES.includes(run.state);
  const filter = useMemo(() => ({
    rank: source.startsWith("rank") ? Number(source.slice(4)) : undefined,
    launcher: source === "launcher",
    q: query.trim() || undefined,
  }), [source, query]);
  useEffect(() => {
    let stop = false;
    const fetchLog = () => api.log(run.id, 500, filter).then((r) => !stop && setLines(r.lines)).catch(() => undefined);
    const first = window.setTimeout(fetchLog, filter.q ? 300 : 0);  // a search waits for the typing to pause
    const t = terminal ? undefined : window.setInterval(fetchLog, 3000);
    return () => {
      stop = true;
      window.clearTimeout(first);
      if (t) window.clearInterval(t);
    };
  }, [run.id, terminal, filter]);
  useEffect(() => {
    if (pre.current) pre.current.scrollTop = pre.current.scrollHeight;
  }, [lines]);
  const shown = lines ?? [];
  return (
    <div className="card" data-testid="log-view">
      <div className="row-between">
        <h3>Trainer log <span className="muted small" data-testid="log-count">({shown.length} lines{shown.length === 500 ? ", the last 500" : ""})</span></h3>
        <span className="actions">
          <select data-testid="log-source" value={source} onChange={(e) => setSource(e.target.value)}>
            <option value="all">all ranks</option>
            {Array.from({ length: ranks }, (_, r) => <option key={r} value={`rank${r}`}>rank {r}</option>)}
            {ranks > 1 ? <option value="launcher">launcher and torchrun</option> : null}
          </select>
          <input data-testid="log-search" type="search" placeholder="search" value={query} onChange={(e) => setQuery(e.target.value)} />
          <a data-testid="log-download" href={api.logDownloadUrl(run.id, filter)} download>download</a>
        </span>
      </div>
      <pre className="log" ref={pre} data-testid="log-tail" data-source={source}>
        {lines === null ? "loading…" : shown.join("\n") || (filter.q ? `no line contains “${filter.q}”` : "no output yet")}
      </pre>
    </div>
  );
}

/** The smallest change that would have fitted an OOM'd run, and a way to take it to the planner. */
function RunFix({ run }: { run: Run }) {
  const [fix, setFix] = useState<Fix | null>(null);
  const [error, setError] = useState("");
  useEffect(() => {
    api.runFix(run.id).then(setFix).catch((e) => setError((e as Error).message));
  }, [run.id]);
  const open = (plan: Plan) => {
    sessionStorage.setItem(LOAD_KEY, JSON.stringify({ ...plan, run: run.spec.run }));
    navigate("/planner");
  };
  return (
    <div className="card warn" data-testid="run-fix-card">
      <h3>Smallest change that fits</h3>
      {error ? <div className="field-error">{error}</div> : fix ? <FixView fix={fix} onApply={open} testid="run-fix" /> : <div className="muted">…</div>}
    </div>
  );
}

export function RunPage({ id }: { id: number }) {
  const { run, setRun, error, store, version, live, zoom, setZoom, lastPointAt } = useRunData(id);
  if (error && !run) return <div className="card error" data-testid="run-load-error">Run {id}: {error}</div>;
  if (!run) return <div className="muted">loading run {id}…</div>;
  const failed = ["failed", "oom", "lost"].includes(run.state);
  return (
    <div className="run-page" data-testid="run-page" data-run-id={run.id}>
      <Header run={run} live={live} lastPointAt={lastPointAt} onChange={setRun} store={store} />
      <Labels key={run.id} run={run} onChange={setRun} />
      <Timeline run={run} />
      <Checkpoints run={run} onChange={setRun} />
      {failed ? (
        <div className="card error" data-testid="error-panel">
          <h3>{run.state === "oom" ? "Out of memory" : run.state === "lost" ? "Worker lost (heartbeat stopped)" : "Run failed"}</h3>
          <pre className="log">{run.exit_reason || "no reason recorded"}</pre>
          {run.state === "oom" && run.estimate?.memory ? (
            <div>The planner predicted {fmtGiB(run.estimate.memory.device_total_gib)} per GPU against {fmtGiB(run.estimate.memory.gpu_capacity_gib)}.</div>
          ) : null}
        </div>
      ) : null}
      {run.state === "oom" ? <RunFix run={run} /> : null}
      {run.attempts && run.attempts.length > 1 ? (
        <div className="card" data-testid="attempts">
          <h3>Attempts</h3>
          <table className="table">
            <thead><tr><th>#</th><th>state</th><th>worker</th><th>started</th><th>finished</th><th>last step</th><th>exit</th></tr></thead>
            <tbody>
              {run.attempts.map((a) => (
                <tr key={a.attempt}>
                  <td>{a.attempt}</td><td>{a.state}</td><td>{a.worker ?? "–"}</td><td>{fmtTime(a.started_at)}</td>
                  <td>{fmtTime(a.finished_at)}</td><td>{a.last_step}</td><td className="mono">{a.exit_reason ?? ""}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      ) : null}
      <div className="buttons" data-testid="metrics-export">
        <span className="muted small">every stored point (step, rank, name, value, wall time):</span>
        <a className="button" href={`/api/runs/${run.id}/metrics.csv`} download data-testid="download-metrics-csv">Download CSV</a>
        <a className="button" href={`/api/runs/${run.id}/metrics.parquet`} download data-testid="download-metrics-parquet">Download Parquet</a>
      </div>
      <RunCharts run={run} store={store} version={version} zoom={zoom} setZoom={setZoom} />
      <LogView run={run} />
      <details className="card">
        <summary>Spec (plan + run)</summary>
        <pre className="export" data-testid="run-spec">{JSON.stringify(run.spec, null, 2)}</pre>
      </details>
    </div>
  );
}
