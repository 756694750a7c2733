import { useQuery } from "@tanstack/react-query";
import { useEffect, useRef, useState } from "react";
import { readZoom } from "../../lib/chartState";
import { ApiError, client, unwrap, unwrapRun, type MetricQuery, type Run, type StreamPoint } from "../../lib/api";
import { putRun, queryClient } from "../../lib/query";
import { withShare } from "../../lib/share";
import { isTerminal } from "../../lib/states";

/** name -> rank -> step -> value */
export type Store = Map<string, Map<number, Map<number, number>>>;
export type Zoom = { start: number; end: number } | null;

/** Points per series past which a live page re-reads the history as ≤1000 buckets. */
const REBUCKET_AT = 4000;

function put(store: Store, name: string, rank: number, step: number, value: number) {
  let byRank = store.get(name);
  if (!byRank) store.set(name, (byRank = new Map()));
  let bySteps = byRank.get(rank);
  if (!bySteps) byRank.set(rank, (bySteps = new Map()));
  bySteps.set(step, value);
}

function merge(store: Store, results: MetricQuery[]) {
  for (const r of results) {
    for (const s of r.series) {
      s.step.forEach((step, i) => {
        put(store, r.name, s.rank, step, s.last[i]);
        // A bucket that holds several steps keeps its range, drawn as a band (name#min / name#max).
        if (s.min[i] !== s.max[i]) {
          put(store, `${r.name}#min`, s.rank, step, s.min[i]);
          put(store, `${r.name}#max`, s.rank, step, s.max[i]);
        }
      });
    }
  }
}

/** Every metric of the run (a point budget per metric, within the zoom range); a metric that cannot be read is named
 * in `failed` and the others are drawn. */
async function readHistory(id: number, z: Zoom): Promise<{ results: MetricQuery[]; failed: string[] }> {
  const path = { run_id: id };
  const names = await unwrap(client.GET("/api/runs/{run_id}/metrics/names", { params: { path } }));
  const range = z ? { start: Math.floor(z.start), end: Math.ceil(z.end) } : {};
  const settled = await Promise.allSettled(names.map((name) => unwrap(client.GET("/api/runs/{run_id}/metrics", {
    params: { path, query: { name, points: 1000, ...range } },
  }))));
  return {
    results: settled.flatMap((s) => (s.status === "fulfilled" ? [s.value] : [])),
    failed: settled.flatMap((s, i) => (s.status === "rejected" ? [`${names[i]}: ${(s.reason as Error).message}`] : [])),
  };
}

/**
 * The run and its metrics, kept live: the SSE stream is opened first, then the history is
 * fetched (a point budget per metric, per zoom range); both merge idempotently on (name, rank, step).
 * The run itself is the query ["run", id]: read once, then replaced by each "state" event of the stream and by the
 * answers of the actions taken on the page. The history is the query ["history", id, zoom].
 */
export function useRunData(id: number) {
  const runQuery = useQuery({
    queryKey: ["run", id],
    queryFn: () => unwrapRun(client.GET("/api/runs/{run_id}", { params: { path: { run_id: id } } })),
  });
  const run = runQuery.data ?? null;
  // What the charts draw: a new outer map at each flush (the series maps inside are shared with the store), so a
  // chart's memo follows it.
  const [view, setView] = useState<Store>(() => new Map());
  const [live, setLive] = useState<"connecting" | "open" | "closed">("connecting");
  const [zoom, setZoom] = useState<Zoom>(readZoom);  // a shared link's zoom (lib/chartState.ts)
  const [lastPointAt, setLastPointAt] = useState<number | null>(null);
  const store = useRef<Store>(new Map());
  const dirty = useRef(false);
  const zoomRef = useRef<Zoom>(null);
  const lastRebucket = useRef(0);
  const rebucket = useRef(false);
  useEffect(() => {
    zoomRef.current = zoom;
  }, [zoom]);

  // Re-render at most ~5 times a second however fast points arrive.
  useEffect(() => {
    const t = window.setInterval(() => {
      if (dirty.current) {
        dirty.current = false;
        setView(new Map(store.current));
      }
    }, 200);
    return () => window.clearInterval(t);
  }, []);

  // The run cannot be read (401, 404): no point keeping the stream open, retrying.
  const fatal = runQuery.error instanceof ApiError && (runQuery.error.status === 401 || runQuery.error.status === 404);

  useEffect(() => {
    if (fatal) return;
    store.current = new Map();
    const es = new EventSource(withShare(`/api/runs/${id}/stream`));
    es.onopen = () => setLive("open");
    es.addEventListener("state", (ev) => {
      try {
        queryClient.setQueryData<Run>(["run", id], JSON.parse((ev as MessageEvent).data));
      } catch { /* ignore a malformed event */ }
    });
    es.addEventListener("metrics", (ev) => {
      try {
        const { points } = JSON.parse((ev as MessageEvent).data) as { points: StreamPoint[] };
        const z = zoomRef.current;
        for (const p of points) {
          if (z && (p.step < z.start || p.step > z.end)) continue;
          put(store.current, p.name, p.rank, p.step, p.value);
        }
        if (points.length) {
          dirty.current = true;
          setLastPointAt(Date.now());
          // A long live run: once a series holds far more points than a chart can show, re-read it as buckets
          // (the store is replaced when they arrive; a failed read keeps it).
          const loss = store.current.get(points[0].name)?.get(points[0].rank);
          if (loss && loss.size > REBUCKET_AT && Date.now() - lastRebucket.current > 10_000) {
            lastRebucket.current = Date.now();
            rebucket.current = true;
            void queryClient.invalidateQueries({ queryKey: ["history", id] });
          }
        }
      } catch { /* ignore */ }
    });
    es.onerror = () => setLive(es.readyState === EventSource.CLOSED ? "closed" : "connecting");
    return () => {
      es.close();
      setLive("closed");
    };
  }, [id, fatal]);

  // History on open and again when the zoom changes (back to the whole run: the store starts afresh).
  useEffect(() => {
    if (zoom === null) store.current = new Map();
  }, [zoom]);
  const history = useQuery({ queryKey: ["history", id, zoom], queryFn: () => readHistory(id, zoom) });
  useEffect(() => {
    if (!history.data) return;
    if (zoom || rebucket.current) store.current = new Map(); // a zoomed view holds only the range's buckets
    rebucket.current = false;
    merge(store.current, history.data.results);
    dirty.current = true;
  }, [history.data, zoom]);

  // When the run ends, one more history read catches anything the stream had not delivered.
  const terminal = run ? isTerminal(run.state) : false;
  useEffect(() => {
    if (terminal) void queryClient.invalidateQueries({ queryKey: ["history", id] });
  }, [terminal, id]);

  const historyError = history.error?.message ?? history.data?.failed.join("; ") ?? "";
  return {
    run, setRun: putRun, error: runQuery.error?.message ?? "", historyError, store: view,
    live: fatal ? "closed" : live, zoom, setZoom, lastPointAt,
  };
}
