import { keepPreviousData, useQueries, useQuery } from "@tanstack/react-query";
import { memo, useCallback, useMemo, useState } from "react";
import { RunActions, StateBadge } from "../components/RunActions";
import { SortHeader } from "../components/SortHeader";
import { client, gpuName, unwrap, type Run } from "../lib/api";
import { fmtDuration, fmtNum, fmtSeq, fmtTime, fmtValue, parseTime } from "../lib/format";
import { readRunFilter, saveRunFilter } from "../lib/chartState";
import { putRun } from "../lib/query";
import { matches, parseFilter } from "../lib/runFilter";
import { navigate } from "../lib/route";
import { isTerminal, RUN_STATES } from "../lib/states";

type Col = { key: string; label: string; value: (r: Run, tps: number | null) => number | string; cls?: string };

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

/** The last measured tokens/s of each started run (one 1-bucket chart query per run: a finished run's once, a live
 * run's on every poll), so the table shows what the run does, falling back to the planner's prediction (marked ≈). */
function useMeasuredTps(runs: Run[] | undefined): Map<number, { tps: number | null; error: string }> {
  const started = (runs ?? []).filter((r) => r.started_at).slice(0, 50);
  return useQueries({
    queries: started.map((r) => ({
      queryKey: ["tps", r.id],
      queryFn: async () => {
        const q = await unwrap(client.GET("/api/runs/{run_id}/metrics", {
          params: { path: { run_id: r.id }, query: { name: "tokens_per_s", points: 1 } },
        }));
        const last = q.series[0]?.last;
        return last && last.length ? last[last.length - 1] : null;
      },
      refetchInterval: isTerminal(r.state) ? false as const : 2000,
      staleTime: isTerminal(r.state) ? Infinity : 0,
    })),
    combine: (results) => new Map(started.map((r, i) => [r.id, {
      tps: results[i].data ?? null,
      error: results[i].error ? `tokens/s: ${results[i].error.message}` : "",
    }])),
  });
}

const COLS: Col[] = [
  { key: "id", label: "#", value: (r) => r.id, cls: "id" },
  { key: "name", label: "name", value: (r) => r.name ?? "" },
  { key: "state", label: "state", value: (r) => RUN_STATES.indexOf(r.state) },
  { key: "model", label: "model", value: model, cls: "opt" },
  { key: "gpus", label: "GPUs", value: gpus, cls: "opt" },
  { key: "seq", label: "seq_len", value: (r) => r.spec?.training?.seq_len ?? 0, cls: "opt" },
  { key: "sp", label: "sp", value: (r) => r.spec?.parallel?.sp_size ?? 0, cls: "opt" },
  { key: "progress", label: "progress", value: (r) => (totalSteps(r) ? (r.last_step ?? 0) / totalSteps(r) : 0) },
  { key: "loss", label: "final loss", value: (r) => r.final_loss ?? Infinity, cls: "opt" },
  { key: "tps", label: "tokens/s", value: (r, tps) => tps ?? (r.device === "cpu" ? 0 : r.estimate?.throughput?.tokens_per_s ?? 0), cls: "opt2" },
  { key: "started", label: "started", value: (r) => r.started_at ?? r.created_at, cls: "opt2" },
  { key: "duration", label: "duration", value: (r) => (r.started_at ? (r.finished_at ? parseTime(r.finished_at) : Date.now()) - parseTime(r.started_at) : -1), cls: "opt" },
];

type RowProps = {
  run: Run; selected: boolean; tps: number | null; tpsError: string;
  onToggle: (id: number) => void; onChange: (r: Run) => void;
};

/** One run's row. Memoized on its props: a poll that answers the same run (the query keeps the same object for an
 * unchanged answer) leaves the row, and the button under the pointer, as they are. */
const RunRow = memo(function RunRow({ run: r, selected, tps, tpsError, onToggle, onChange }: RowProps) {
  const steps = totalSteps(r);
  // the open ones (the last attempt's, that stopped nothing) stand in the state badge
  const open = new Set((r.open_alerts ?? []).map((a) => `${a.attempt}:${a.kind}`));
  const closed = (r.alerts ?? []).filter((a) => !open.has(`${a.attempt}:${a.kind}`));
  return (
    <tr data-testid={`run-row-${r.id}`} data-state={r.state}>
      <td className="sel"><input type="checkbox" aria-label={`select run ${r.id}`} data-testid={`select-${r.id}`} checked={selected} onChange={() => onToggle(r.id)} /></td>
      <td className="id"><a href={`#/runs/${r.id}`}>{r.id}</a></td>
      <td className="name"><a href={`#/runs/${r.id}`} data-testid={`run-link-${r.id}`}>{r.name || "(unnamed)"}</a>
        {(r.tags ?? []).map((t) => <span key={t} className="badge" data-testid={`run-tag-${r.id}-${t}`}>{t}</span>)}</td>
      <td><StateBadge run={r} testid={`run-state-${r.id}`} />
        {closed.length ? <span className="badge bad" data-testid={`run-alert-badge-${r.id}`} title={closed.map((a) => a.message).join("\n")}>
          {closed.map((a) => a.kind.replace("_", " ")).join(", ")}</span> : null}
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
      <td className="opt2" data-testid={`run-tps-${r.id}`} title={tpsError || "last measured; ≈ = the planner's prediction"}>
        {tps != null ? fmtNum(tps) : r.device === "cpu" ? "no CPU prediction" : `≈${fmtNum(r.estimate?.throughput?.tokens_per_s)}`}</td>
      <td className="opt2">{fmtTime(r.started_at)}</td>
      <td className="opt">{fmtDuration(r.started_at, r.finished_at)}</td>
      <td><RunActions run={r} onChange={onChange} compact /></td>
    </tr>
  );
});

export function Runs() {
  const [state, setState] = useState("");
  const [tag, setTag] = useState("");
  const [q, setQ] = useState("");
  const [where, setWhere] = useState(readRunFilter);
  const filter = useMemo(() => parseFilter(where), [where]);
  const [sort, setSort] = useState<{ key: string; dir: 1 | -1 }>({ key: "id", dir: -1 });
  const [selected, setSelected] = useState<number[]>([]);

  // Live state: the list is read again every 2 s (cheap; one query). Each state filter has its own query, so a late
  // answer for the previous filter never replaces the rows of the current one; the text filter runs here (it also
  // matches model and id, which the API's q does not).
  const list = useQuery({
    queryKey: ["runs", state],
    queryFn: ({ signal }) => unwrap(client.GET("/api/runs", { params: { query: state ? { state } : {} }, signal })) as Promise<Run[]>,
    refetchInterval: 2000,
    placeholderData: keepPreviousData,
  });
  const runs = list.data;
  const measured = useMeasuredTps(runs);

  const rows = useMemo(() => {
    if (!runs) return [];
    const col = COLS.find((c) => c.key === sort.key) ?? COLS[0];
    const text = q.trim().toLowerCase();
    const value = (r: Run) => col.value(r, measured.get(r.id)?.tps ?? null);
    return runs
      .filter((r) => (!state || r.state === state) && (!tag || (r.tags ?? []).includes(tag))
        && (!text || `${r.id} ${r.name} ${model(r)} ${r.state} ${(r.tags ?? []).join(" ")}`.toLowerCase().includes(text))
        && matches(r, filter.clauses, { tokens_per_s: measured.get(r.id)?.tps ?? null }))
      .sort((a, b) => {
        const va = value(a), vb = value(b);
        return (va < vb ? -1 : va > vb ? 1 : 0) * sort.dir;
      });
  }, [runs, sort, q, state, tag, measured, filter]);

  const onChange = useCallback((r: Run) => void putRun(r), []);
  const toggle = useCallback((id: number) => setSelected((s) => (s.includes(id) ? s.filter((x) => x !== id) : [...s, id])), []);

  return (
    <div className="runs-page">
      <div className="toolbar">
        <select data-testid="runs-filter-state" value={state} onChange={(e) => setState(e.target.value)}>
          <option value="">all states</option>
          {RUN_STATES.map((s) => <option key={s} value={s}>{s.replace(/_/g, " ")}</option>)}
        </select>
        <select data-testid="runs-filter-tag" value={tag} onChange={(e) => setTag(e.target.value)}>
          <option value="">all tags</option>
          {[...new Set((runs ?? []).flatMap((r) => r.tags ?? []))].sort().map((t) => <option key={t}>{t}</option>)}
        </select>
        <input data-testid="runs-filter-text" placeholder="filter by name, model…" value={q} onChange={(e) => setQ(e.target.value)} />
        <input data-testid="runs-where" className="where" placeholder="where: training.seq_len>=64K, final_loss<4.5, run.learning_rate<1e-3"
          title="any plan field (model., hardware., parallel., training., run.) or run figure (final_loss, tokens_per_s, state, tags, estimate.…), with = != < <= > >= ~ (contains); clauses joined by commas"
          value={where} onChange={(e) => { setWhere(e.target.value); saveRunFilter(e.target.value); }} />
        <button type="button" data-testid="compare-selected" disabled={selected.length < 2}
          onClick={() => navigate(`/compare?ids=${selected.join(",")}`)}>
          Compare {selected.length ? `(${selected.length})` : ""}
        </button>
      </div>
      {filter.error ? <div className="field-error" data-testid="runs-where-error">{filter.error}</div> : null}
      {list.error ? <div className="card error" data-testid="runs-error">{list.error.message}</div> : null}
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
            const m = measured.get(r.id);
            return <RunRow key={r.id} run={r} selected={selected.includes(r.id)} tps={m?.tps ?? null} tpsError={m?.error ?? ""}
              onToggle={toggle} onChange={onChange} />;
          })}
        </tbody>
      </table>
      {runs && rows.length === 0 ? <div className="muted" data-testid="runs-empty">No runs{state || q || where ? " match the filter" : " yet: plan one in the Planner"}.</div> : null}
    </div>
  );
}
