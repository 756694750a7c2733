// The run page's chart state in the hash route's query, so a copied link opens the same view:
//   #/runs/12?zoom=20-60&smooth=0.3&planner=0&hide=loss-chart~EMA&hide=cpu-chart~rank%201
// zoom: the step range the charts show; smooth: the loss EMA factor; planner=0: planner lines off;
// hide (repeated): a series switched off in one chart's legend, as <chart testid>~<series label>.
// Writes use history.replaceState, which fires no hashchange: the page is not re-routed or re-mounted.

export type StepRange = { start: number; end: number };

function query(): URLSearchParams {
  const hash = window.location.hash;
  const at = hash.indexOf("?");
  return new URLSearchParams(at < 0 ? "" : hash.slice(at + 1));
}

function write(q: URLSearchParams) {
  const path = window.location.hash.split("?")[0] || "#/";
  const text = q.toString();
  const url = `${window.location.pathname}${window.location.search}${path}${text ? `?${text}` : ""}`;
  if (url !== `${window.location.pathname}${window.location.search}${window.location.hash}`) {
    window.history.replaceState(window.history.state, "", url);
  }
}

function setParam(key: string, value: string | null) {
  const q = query();
  if (value === null) q.delete(key);
  else q.set(key, value);
  write(q);
}

/** The zoomed step range in the URL ("zoom=20-60"), or null (whole run; also for a malformed value). */
export function readZoom(): StepRange | null {
  const m = /^(\d+)-(\d+)$/.exec(query().get("zoom") ?? "");
  if (!m) return null;
  const start = Number(m[1]);
  const end = Number(m[2]);
  return end > start ? { start, end } : null;
}

export function saveZoom(zoom: StepRange | null) {
  setParam("zoom", zoom ? `${zoom.start}-${zoom.end}` : null);
}

/** The EMA smoothing in the URL, within [0, 0.99], or null. */
export function readSmoothing(): number | null {
  const raw = query().get("smooth");
  const v = raw === null || raw === "" ? NaN : Number(raw);
  return Number.isFinite(v) && v >= 0 && v <= 0.99 ? v : null;
}

export function saveSmoothing(v: number, byDefault: number) {
  setParam("smooth", v === byDefault ? null : String(v));
}

/** Whether the planner's lines are drawn: only "planner=0" turns them off. */
export function readPlannerLines(): boolean {
  return query().get("planner") !== "0";
}

export function savePlannerLines(on: boolean) {
  setParam("planner", on ? null : "0");
}

const SEP = "~";

/** The series labels switched off in one chart's legend. */
export function hiddenSeries(chart: string): Set<string> {
  const prefix = `${chart}${SEP}`;
  return new Set(query().getAll("hide").filter((h) => h.startsWith(prefix)).map((h) => h.slice(prefix.length)));
}

export function saveSeriesShown(chart: string, label: string, shown: boolean) {
  const q = query();
  const key = `${chart}${SEP}${label}`;
  const rest = q.getAll("hide").filter((h) => h !== key);
  q.delete("hide");
  for (const h of shown ? rest : [...rest, key]) q.append("hide", h);
  write(q);
}

/** The link to this view: the page's URL with the state above. */
export function shareUrl(): string {
  return window.location.href;
}

/** What the run page's charts put on their x axis: the step (default), the wall time since the first step, or the
 * tokens trained ("x=time", "x=tokens"). */
export type XKind = "step" | "time" | "tokens";

export function readXKind(): XKind {
  const v = query().get("x");
  return v === "time" || v === "tokens" ? v : "step";
}

export function saveXKind(kind: XKind) {
  setParam("x", kind === "step" ? null : kind);
}

/** A log-scale y axis on the metric charts ("logy=1"). */
export function readLogY(): boolean {
  return query().get("logy") === "1";
}

export function saveLogY(on: boolean) {
  setParam("logy", on ? "1" : null);
}

/** The metrics drawn together on the run page's combined chart ("overlay=loss,grad_norm"). */
export function readOverlay(): string[] {
  return (query().get("overlay") ?? "").split(",").filter(Boolean);
}

export function saveOverlay(names: string[]) {
  setParam("overlay", names.length ? names.join(",") : null);
}

/** A view-only link ("view=1"): the page shows the run and its charts without the buttons that change it. */
export function readViewOnly(): boolean {
  return query().get("view") === "1";
}

/** The link to this view with the hash query's `set` entries set and its `drop` ones left out. */
export function viewUrl(set: Record<string, string>, drop: string[] = []): string {
  const [path, rest] = window.location.href.split("?");
  const q = new URLSearchParams(rest ?? "");
  for (const key of drop) q.delete(key);
  for (const [key, value] of Object.entries(set)) q.set(key, value);
  return `${path}?${q.toString()}`;
}

/** The link to this view with "view=1": whoever opens it sees the same charts, with no action on the run. */
export function viewOnlyUrl(): string {
  return viewUrl({ view: "1" });
}

/** The runs list's filter on plan fields and final metrics ("where=training.seq_len>=64K, final_loss<4.5"). */
export function readRunFilter(): string {
  return query().get("where") ?? "";
}

export function saveRunFilter(text: string) {
  setParam("where", text.trim() ? text : null);
}
