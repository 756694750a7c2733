import { useCallback, useEffect, useMemo, useRef, useState } from "react";
import { RunActions, StateBadge } from "../components/RunActions";
import { SortHeader } from "../components/SortHeader";
import { api, gpuName, TERMINAL, type Run, type RunState } from "../lib/api";
import { fmtDuration, fmtNum, fmtSeq, fmtTime, fmtValue, parseTime } from "../lib/format";
import { navigate } from "../lib/route";

const STATES: RunState[] = ["pending_approval", "queued", "starting", "running", "succeeded", "failed", "oom", "cancelled", "lost", "stopped"];

type Col = { key: string; label: string; value: (r: Run) => number | string; cls?: string };

function model(r: Run): string {
  const m = r.spec?.model;
  return m?.preset ?? (m?.config ? "custom config" : "–");
}
function gpus(r: Run): number {
  return (r.spec?.hardware?.gpus_per_node ?? 0) * (r.spec?.hardware?.num_nodes ?? 1);
}
function totalSteps(r: Run): number {
  return r.steps ?? Number(r.spec?.run?.steps ?? 0);
}
/** The last measured tokens/s of each run (one 1-bucket chart query per run: finished runs once, running ones on every
 * refresh), so the table shows what the run does, falling back to the planner's prediction (marked ≈). */
const measuredTps = new Map<number, number | null>();
async function refreshMeasured(runs: Run[]): Promise<boolean> {
  const todo = runs.filter((r) => r.started_at && (!measuredTps.has(r.id) || !TERMINAL.includes(r.state))).slice(0, 50);
  const got = await Promise.all(todo.map((r) => api.metrics(r.id, "tokens_per_s", 1).catch(() => null)));
  todo.forEach((r, i) => {
    const last = got[i]?.series[0]?.last;
    measuredTps.set(r.id, last && last.length ? last[last.length - 1] : null);
  });
  return todo.length > 0;
}
function tokensPerS(r: Run): number {
  return measuredTps.get(r.id) ?? r.estimate?.throughput?.tokens_per_s ?? 0;
}
function tokensLabel(r: Run): string {
  const m = measuredTps.get(r.id);
  return m != null ? fmtNum(m) : `≈${fmtNum(r.estimate?.throughput?.tokens_per_s)}`;
}

const COLS: Col[] = [
  { key: "id", label: "#", value: (r) => r.id, cls: "id" },
  { key: "name", label: "name", value: (r) => r.name ?? "" },
  { key: "state", label: "state", value: (r) => STATES.indexOf(r.state) },
  { key: "model", label: "model", value: model, cls: "opt" },
  { key: "gpus", label: "GPUs", value: gpus, cls: "opt" },
  { key: "seq", label: "seq_len", value: (r) => r.spec?.training?.seq_len ?? 0, cls: "opt" },
  { key: "sp", label: "sp", value: (r) => r.spec?.parallel?.sp_size ?? 0, cls: "opt" },
  { key: "progress", label: "progress", value: (r) => (totalSteps(r) ? (r.last_step ?? 0) / totalSteps(r) : 0) },
  { key: "loss", label: "final loss", value: (r) => r.final_loss ?? Infinity, cls: "opt" },
  { key: "tps", label: "tokens/s", value: tokensPerS, cls: "opt2" },
  { key: "started", label: "started", value: (r) => r.started_at ?? r.created_at, cls: "opt2" },
  { key: "duration", label: "duration", value: (r) => (r.started_at ? (r.finished_at ? parseTime(r.finished_at) : Date.now()) - parseTime(r.started_at) : -1), cls: "opt" },
];

export function Runs() {
  const [runs, setRuns] = useState<Run[] | null>(null);
  const [error, setError] = useState("");
  const [state, setState] = useState("");
  const [tag, setTag] = useState("");
  const [q, setQ] = useState("");
  const [sort, setSort] = useState<{ key: string; dir: 1 | -1 }>({ key: "id", dir: -1 });
  const [selected, setSelected] = useState<number[]>([]);

  const [, setMeasuredVersion] = useState(0);
  // Only the newest request may set the rows: a slow answer for the previous state filter (or a poll that started
  // before an action) arriving late would otherwise swap the rows back for a moment, detaching the button a person is
  // about to click (the e2e cancel test saw "element was detached from the DOM").
  const latest = useRef(0);
  const load = useCallback(() => {
    const ask = ++latest.current;
    // The text filter runs here (it also matches model and id, which the API's q does not).
    api.runs(state || undefined)
      .then((r) => {
        if (ask !== latest.current) return;
        setRuns(r);
        setError("");
        refreshMeasured(r).then((changed) => changed && setMeasuredVersion((v) => v + 1)).catch(() => undefined);
      })
      .catch((e) => ask === latest.current && setError(e.message));
  }, [state]);

  // Live state: re-read the list every 2 s (cheap; one query).
  useEffect(() => {
    load();
    const t = window.setInterval(load, 2000);
    return () => window.clearInterval(t);
  }, [load]);

  const rows = useMemo(() => {
    if (!runs) return [];
    const col = COLS.find((c) => c.key === sort.key) ?? COLS[0];
    const text = q.trim().toLowerCase();
    return runs
      .filter((r) => (!state || r.state === state) && (!tag || (r.tags ?? []).includes(tag))
        && (!text || `${r.id} ${r.name} ${model(r)} ${r.state} ${(r.tags ?? []).join(" ")}`.toLowerCase().includes(text)))
      .sort((a, b) => {
        const va = col.value(a), vb = col.value(b);
        return (va < vb ? -1 : va > vb ? 1 : 0) * sort.dir;
      });
  }, [runs, sort, q, state, tag]);

  const onChange = (r: Run) => {
    latest.current++;  // a poll already in flight predates this action: its rows are stale
    setRuns((rs) => (rs ?? []).map((x) => (x.id === r.id ? r : x)));
  };
  const toggle = (id: number) => setSelected((s) => (s.includes(id) ? s.filter((x) => x !== id) : [...s, id]));

  return (
    <div className="runs-page">
      <div className="toolbar">
        <select data-testid="runs-filter-state" value={state} onChange={(e) => setState(e.target.value)}>
          <option value="">all states</option>
          {STATES.map((s) => <option key={s} value={s}>{s.replace(/_/g, " ")}</option>)}
        </select>
        <select data-testid="runs-filter-tag" value={tag} onChange={(e) => setTag(e.target.value)}>
          <option value="">all tags</option>
          {[...new Set((runs ?? []).flatMap((r) => r.tags ?? []))].sort().map((t) => <option key={t}>{t}</option>)}
        </select>
        <input data-testid="runs-filter-text" placeholder="filter by name, model…" value={q} onChange={(e) => setQ(e.target.value)} />
        <button type="button" data-testid="compare-selected" disabled={selected.length < 2}
          onClick={() => navigate(`/compare?ids=${selected.join(",")}`)}>
          Compare {selected.length ? `(${selected.length})` : ""}
        </button>
      </div>
      {error ? <div className="card error">{error}</div> : null}
      <table className="table runs-table" data-testid="runs-table" data-count={rows.length}>
        <thead>
          <tr>
            <th className="sel" />
            {COLS.map((c) => (
              <SortHeader key={c.key} label={c.label} className={c.cls} testid={`sort-${c.key}`} active={sort.key === c.key} dir={sort.dir}
                onSort={() => setSort((s) => ({ key: c.key, dir: s.key === c.key ? (-s.dir as 1 | -1) : 1 }))} />
            ))}
            <th>actions</th>
          </tr>
        </thead>
        <tbody>
          {rows.map((r) => {
            const steps = totalSteps(r);
            return (
              <tr key={r.id} data-testid={`run-row-${r.id}`} data-state={r.state}>
                <td className="sel"><input type="checkbox" aria-label={`select run ${r.id}`} data-testid={`select-${r.id}`} checked={selected.includes(r.id)} onChange={() => toggle(r.id)} /></td>
                <td className="id"><a href={`#/runs/${r.id}`}>{r.id}</a></td>
                <td className="name"><a href={`#/runs/${r.id}`} data-testid={`run-link-${r.id}`}>{r.name || "(unnamed)"}</a>
                  {(r.tags ?? []).map((t) => <span key={t} className="badge" data-testid={`run-tag-${r.id}-${t}`}>{t}</span>)}</td>
                <td><StateBadge run={r} testid={`run-state-${r.id}`} />
                  {(r.alerts ?? []).length ? <span className="badge bad" data-testid={`run-alert-badge-${r.id}`} title={(r.alerts ?? []).map((a) => a.message).join("\n")}>
                    {(r.alerts ?? []).map((a) => a.kind.replace("_", " ")).join(", ")}</span> : null}
                </td>
                <td className="opt">{model(r)}</td>
                <td className="opt">{r.device === "cpu" ? `CPU ranks × ${gpus(r)}` : `${gpuName(r.spec?.hardware?.gpu)} × ${gpus(r)}`}</td>
                <td className="opt">{r.spec?.training ? fmtSeq(r.spec.training.seq_len) : "–"}</td>
                <td className="opt">{r.spec?.parallel?.sp_size}</td>
                <td>
                  <div className="mini-progress" title={`${r.last_step ?? 0} / ${steps}`}>
                    <div style={{ width: `${steps ? Math.min(100, (100 * (r.last_step ?? 0)) / steps) : 0}%` }} />
                  </div>
                  <span className="muted small">{r.last_step ?? 0}/{steps || "?"}</span>
                </td>
                <td className="opt" data-testid={`run-loss-${r.id}`}>{r.final_loss != null ? fmtValue(r.final_loss) : "–"}</td>
                <td className="opt2" data-testid={`run-tps-${r.id}`} title="last measured; ≈ = the planner's prediction">{tokensLabel(r)}</td>
                <td className="opt2">{fmtTime(r.started_at)}</td>
                <td className="opt">{fmtDuration(r.started_at, r.finished_at)}</td>
                <td><RunActions run={r} onChange={onChange} compact /></td>
              </tr>
            );
          })}
        </tbody>
      </table>
      {runs && rows.length === 0 ? <div className="muted" data-testid="runs-empty">No runs{state || q ? " match the filter" : " yet: plan one in the Planner"}.</div> : null}
    </div>
  );
}
