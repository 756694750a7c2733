import { useCallback, useEffect, useRef, useState } from "react";
import { readZoom } from "../../lib/chartState";
import { api, ApiError, TERMINAL, type Run, type StreamPoint } from "../../lib/api";

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

/**
 * The run and its metrics, kept live: the SSE stream is opened first, then the history is
 * fetched (a point budget per metric, per zoom range); both merge idempotently on (name, rank, step).
 */
export function useRunData(id: number) {
  const [run, setRun] = useState<Run | null>(null);
  const [error, setError] = useState("");
  const [version, setVersion] = useState(0);
  const [live, setLive] = useState<"connecting" | "open" | "closed">("connecting");
  const [zoom, setZoom] = useState<Zoom>(readZoom);  // a shared link's zoom (lib/chartState.ts)
  const [lastPointAt, setLastPointAt] = useState<number | null>(null);
  const store = useRef<Store>(new Map());
  const dirty = useRef(false);
  const zoomRef = useRef<Zoom>(null);
  const lastRebucket = useRef(0);
  zoomRef.current = zoom;

  // Re-render at most ~5 times a second however fast points arrive.
  useEffect(() => {
    const t = window.setInterval(() => {
      if (dirty.current) {
        dirty.current = false;
        setVersion((v) => v + 1);
      }
    }, 200);
    return () => window.clearInterval(t);
  }, []);

  const loadHistory = useCallback(async (z: Zoom) => {
    const names = await api.metricNames(id);
    const results = await Promise.all(names.map((n) => api.metrics(id, n, 1000, z?.start, z?.end).catch(() => null)));
    if (z) store.current = new Map(); // a zoomed view holds only the range's buckets
    for (const r of results) {
      if (!r) continue;
      for (const s of r.series) {
        s.step.forEach((step, i) => {
          put(store.current, r.name, s.rank, step, s.last[i]);
          // A bucket that holds several steps keeps its range, drawn as a band (name#min / name#max).
          if (s.min[i] !== s.max[i]) {
            put(store.current, `${r.name}#min`, s.rank, step, s.min[i]);
            put(store.current, `${r.name}#max`, s.rank, step, s.max[i]);
          }
        });
      }
    }
    dirty.current = true;
  }, [id]);

  useEffect(() => {
    store.current = new Map();
    setRun(null);
    setError("");
    const es = new EventSource(`/api/runs/${id}/stream`);
    api.run(id).then(setRun).catch((e) => {
      setError(e.message);
      if (e instanceof ApiError && (e.status === 401 || e.status === 404)) es.close(); // no point retrying
    });
    es.onopen = () => setLive("open");
    es.addEventListener("state", (ev) => {
      try {
        setRun(JSON.parse((ev as MessageEvent).data));
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
          // A long live run: once a series holds far more points than a chart can show, re-read it as buckets.
          const loss = store.current.get(points[0].name)?.get(points[0].rank);
          if (loss && loss.size > REBUCKET_AT && Date.now() - lastRebucket.current > 10_000) {
            lastRebucket.current = Date.now();
            const fresh: Store = new Map();
            const old = store.current;
            store.current = fresh;
            loadHistory(zoomRef.current).catch(() => { store.current = old; });
          }
        }
      } catch { /* ignore */ }
    });
    es.onerror = () => setLive(es.readyState === EventSource.CLOSED ? "closed" : "connecting");
    return () => {
      es.close();
      setLive("closed");
    };
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [id]);

  // History on open and again when the zoom changes.
  useEffect(() => {
    if (zoom === null) store.current = new Map();
    loadHistory(zoom).catch(() => undefined);
  }, [zoom, loadHistory]);

  // When the run ends, one more history load catches anything the stream had not delivered.
  const terminal = run ? TERMINAL.includes(run.state) : false;
  useEffect(() => {
    if (terminal) loadHistory(zoomRef.current).catch(() => undefined);
  }, [terminal, loadHistory]);

  return { run, setRun, error, store: store.current, version, live, zoom, setZoom, lastPointAt };
}
