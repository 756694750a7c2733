import { keepPreviousData, useQuery } from "@tanstack/react-query";
import { useEffect, useMemo, useRef, useState } from "react";
import { client, logDownloadUrl, unwrap, type LogFilter, type Run } from "../../lib/api";
import { isTerminal } from "../../lib/states";

/** `value` once it has not changed for `ms` (the first value at once). */
function usePaused<T>(value: T, ms: number): T {
  const [paused, setPaused] = useState(value);
  useEffect(() => {
    const t = window.setTimeout(() => setPaused(value), ms);
    return () => window.clearTimeout(t);
  }, [value, ms]);
  return paused;
}

/** The trainer log: every line, one rank's (torchrun tags each with [rankN]:) or the launcher's, searched, and
 * downloaded whole. Polled while the run is active. */
export function LogView({ run }: { run: Run }) {
  const ranks = (run.spec.parallel?.sp_size ?? 1) * (run.spec.parallel?.dp_size ?? 1);
  const [source, setSource] = useState("all");
  const [query, setQuery] = useState("");
  const pre = useRef<HTMLPreElement>(null);
  const terminal = isTerminal(run.state);
  const filter = useMemo<LogFilter>(() => ({
    rank: source.startsWith("rank") ? Number(source.slice(4)) : undefined,
    launcher: source === "launcher",
    q: query.trim() || undefined,
  }), [source, query]);
  // what is read: a search waits for the typing to pause (the download link follows the filter at once)
  const asked = usePaused(filter, filter.q ? 300 : 0);
  // polled while the run is active; the lines shown stay until the next answer (a new filter's too)
  const read = useQuery({
    queryKey: ["log", run.id, asked],
    queryFn: () => unwrap(client.GET("/api/runs/{run_id}/log", {
      params: { path: { run_id: run.id }, query: { lines: 500, ...asked, launcher: asked.launcher || undefined } },
    })),
    refetchInterval: terminal ? false : 3000,
    placeholderData: keepPreviousData,
  });
  const lines = read.data?.lines ?? null;
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
          <a data-testid="log-download" href={logDownloadUrl(run.id, filter)} download>download</a>
        </span>
      </div>
      {read.error ? <div className="field-error" data-testid="log-error">{read.error.message}</div> : null}
      <pre className="log" ref={pre} data-testid="log-tail" data-source={source}>
        {lines === null ? "loading…" : shown.join("\n") || (filter.q ? `no line contains “${filter.q}”` : "no output yet")}
      </pre>
    </div>
  );
}
