// Typed client for the HTTP API v1 (docs/api.md). All paths are relative so the API can serve the build.

import type { components } from "./schema";

// The API's types are generated from its OpenAPI schema at build time (npm run gen: openapi.json -> schema.d.ts),
// which FastAPI builds from the plan model (plan/model.py): a plan field exists here because it exists there.
type Schemas = components["schemas"];

/** plan-v1 (+ the trainer's optional `run` section), as the API accepts it: fields with defaults are optional. */
export type Plan = Schemas["Plan"];
export type RunSection = Schemas["RunSection"];
/** A GPU not in the catalog: the columns of gpus.csv. */
export type CustomGpu = Schemas["CustomGpu"];
export type FieldError = Schemas["FieldErrorOut"];
export type Estimate = Schemas["Estimate"];
export type SweepSeries = Schemas["SweepSeries"];
export type Sweep = Schemas["Sweep"];
export type Export = Schemas["Exports"];
export type Catalog = Schemas["Catalog"];
export type PlanDefaults = Schemas["PlanDefaults"];
export type Recommend = Schemas["Recommend"];
export type Recommendation = Schemas["Recommendation"];
export type Fix = Schemas["Fix"];
export type SpMethods = Schemas["SpMethods"];
export type Calibration = Schemas["Calibration"];
export type PlanImport = Schemas["PlanImport"];
export type PlanImported = Schemas["PlanImported"];
export type WorkerInfo = Schemas["WorkerOut"];
export type RunEvent = Schemas["EventOut"];
/** A stored plan: the API stores it with every default filled in. */
export type StoredPlan = Omit<Schemas["PlanOut"], "plan"> & { plan: Plan };

export function gpuName(gpu: string | CustomGpu | undefined): string {
  return gpu === undefined ? "–" : typeof gpu === "string" ? gpu : `${gpu.name ?? "custom"} (custom)`;
}

export type RunState =
  | "pending_approval" | "queued" | "starting" | "running"
  | "succeeded" | "failed" | "oom" | "cancelled" | "lost" | "stopped";

/** A run as the API answers it; its spec is the plan it runs, every default filled in. */
export type Run = Omit<Schemas["RunOut"], "spec" | "state" | "attempts"> & { spec: Plan; state: RunState; attempts?: Attempt[] };
export type Attempt = Omit<Schemas["AttemptOut"], "state"> & { state: RunState };

export type Role = "viewer" | "submitter" | "approver" | "admin" | "worker";
export type Identity = { name: string; role: Role; token_id: number | null };

/** Fired on any 401 so the app can offer sign-in (the token lives in an httpOnly cookie). */
export const UNAUTHORIZED_EVENT = "ulab:unauthorized";

export type MetricSeries = { rank: number; step: number[]; min: number[]; max: number[]; last: number[] };
export type MetricQuery = { name: string; series: MetricSeries[] };
export type StreamPoint = { rank: number; step: number; name: string; value: number };

export const TERMINAL: RunState[] = ["succeeded", "failed", "oom", "cancelled", "lost", "stopped"];

export class ApiError extends Error {
  status: number;
  fields: FieldError[];
  constructor(status: number, message: string, fields: FieldError[]) {
    super(message);
    this.status = status;
    this.fields = fields;
  }
}

async function request<T>(method: string, path: string, body?: unknown, signal?: AbortSignal): Promise<T> {
  const res = await fetch(path, {
    method,
    headers: body === undefined ? {} : { "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
  });
  if (res.ok && res.headers.get("Content-Type")?.startsWith("application/zip")) return (await res.blob()) as T;
  const text = await res.text();
  let data: unknown = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = text;
  }
  if (!res.ok) {
    if (res.status === 401 && !path.startsWith("/api/session")) window.dispatchEvent(new Event(UNAUTHORIZED_EVENT));
    const detail = (data as { detail?: unknown } | null)?.detail;
    let fields: FieldError[] = [];
    let message = `${res.status} ${res.statusText}`;
    if (Array.isArray(detail)) {
      // ours: {field, message}; FastAPI's own validation: {loc, msg}
      fields = detail.map((d: Record<string, unknown>) => ({
        field: String(d.field ?? (Array.isArray(d.loc) ? d.loc.filter((x) => x !== "body").join(".") : "")),
        message: String(d.message ?? d.msg ?? JSON.stringify(d)),
      }));
      message = fields.map((f) => (f.field ? `${f.field}: ${f.message}` : f.message)).join("; ");
    } else if (typeof detail === "string") {
      message = detail;
    }
    throw new ApiError(res.status, message, fields);
  }
  return data as T;
}

/** Which lines of a trainer log: one rank's (`rank`), the launcher's, and those containing `q`. */
export type LogFilter = { rank?: number; launcher?: boolean; q?: string };

function logParams(f: LogFilter, lines?: number): string {
  const p = new URLSearchParams();
  if (lines !== undefined) p.set("lines", String(lines));
  if (f.rank !== undefined) p.set("rank", String(f.rank));
  if (f.launcher) p.set("launcher", "true");
  if (f.q) p.set("q", f.q);
  return p.toString();
}

export const api = {
  catalog: () => request<Catalog>("GET", "/api/catalog"),
  estimate: (plan: Plan, signal?: AbortSignal) => request<Estimate>("POST", "/api/estimate", plan, signal),
  maxSeq: (plan: Plan, signal?: AbortSignal) =>
    request<{ max_seq_len: number; estimate: Estimate }>("POST", "/api/estimate/max-seq", plan, signal),
  /** sp_sizes / seq_lens omitted: the planner picks the valid sp sizes and a grid up to the longest fit. */
  sweep: (plan: Plan, signal?: AbortSignal, sp_sizes?: number[], seq_lens?: number[]) =>
    request<Sweep>("POST", "/api/estimate/sweep", { plan, sp_sizes, seq_lens }, signal),
  exportPlan: (plan: Plan) => request<Export>("POST", "/api/estimate/export", plan),
  /** every exported file for every node, in one zip (the plan needs a run section) */
  exportZip: (plan: Plan) => request<Blob>("POST", "/api/estimate/export.zip", plan),
  /** configurations that fit the plan's model and hardware at its seq_len (or the longest), best first */
  recommend: (plan: Plan, longest = false, signal?: AbortSignal) =>
    request<Recommend>("POST", "/api/estimate/recommend", { plan, longest }, signal),
  fix: (plan: Plan, signal?: AbortSignal) => request<Fix>("POST", "/api/estimate/fix", plan, signal),
  runFix: (id: number) => request<Fix>("GET", `/api/runs/${id}/fix`),
  spMethods: (plan: Plan) => request<SpMethods>("POST", "/api/estimate/sp-methods", plan),
  calibration: () => request<Calibration>("GET", "/api/calibration"),
  workers: () => request<WorkerInfo[]>("GET", "/api/workers"),
  createPlan: (plan: Plan, name?: string) => request<StoredPlan>("POST", "/api/plans", { ...plan, name }),
  plans: () => request<StoredPlan[]>("GET", "/api/plans"),
  planDefaults: () => request<PlanDefaults>("GET", "/api/plans/defaults"),
  importPlan: (body: PlanImport) => request<PlanImported>("POST", "/api/plans/import", body),
  plan: (id: number) => request<StoredPlan>("GET", `/api/plans/${id}`),
  probePlan: (id: number, body?: { depths?: number[]; steps?: number }) => request<Run>("POST", `/api/plans/${id}/probe`, body ?? {}),
  /** the plan with every default filled in; a 422 names each broken field (unknown keys, presets and GPUs too) */
  effectivePlan: (plan: unknown) => request<Plan>("POST", "/api/plans/effective", plan),
  createRun: (plan_id: number, run: RunSection, name?: string, extra?: { priority?: number; max_retries?: number }) =>
    request<Run>("POST", "/api/runs", { plan_id, name, run, ...extra }),
  /** the plan and its run in one request: the plan is stored only when the run is created */
  submitRun: (plan: Plan, run: RunSection, name?: string, extra?: { priority?: number; max_retries?: number }) =>
    request<Run>("POST", "/api/runs", { plan, name, run, ...extra }),
  runs: (state?: string, q?: string) => {
    const p = new URLSearchParams();
    if (state) p.set("state", state);
    if (q) p.set("q", q);
    const qs = p.toString();
    return request<Run[]>("GET", `/api/runs${qs ? `?${qs}` : ""}`);
  },
  run: (id: number) => request<Run>("GET", `/api/runs/${id}`),
  approve: (id: number, force = false) => request<Run>("POST", `/api/runs/${id}/approve${force ? "?force=true" : ""}`),
  whoami: () => request<Identity>("GET", "/api/session"),
  signIn: (token: string) => request<Identity>("POST", "/api/session", { token }),
  signOut: () => request<null>("DELETE", "/api/session"),
  cancel: (id: number) => request<Run>("POST", `/api/runs/${id}/cancel`),
  /** the run's timeline, oldest first: submitted, approved, each attempt's start and end, alerts */
  events: (id: number) => request<RunEvent[]>("GET", `/api/runs/${id}/events`),
  checkpoints: (id: number) => request<Schemas["CheckpointOut"][]>("GET", `/api/runs/${id}/checkpoints`),
  label: (id: number, labels: { tags?: string[]; notes?: string }) => request<Run>("PATCH", `/api/runs/${id}`, labels),
  /** the next attempt of the same run, resuming from its last checkpoint (approvers) */
  retry: (id: number) => request<Run>("POST", `/api/runs/${id}/retry`),
  /** "resume from here": the next attempt resumes from this checkpoint; newer ones are moved aside (approvers) */
  /** "resume from here", optionally at another learning rate or schedule (the run's timeline records it) */
  retryFrom: (id: number, checkpoint: string, change?: { learning_rate?: number; lr_scheduler?: string }) =>
    request<Run>("POST", `/api/runs/${id}/retry`, { from_checkpoint: checkpoint, ...change }),
  /** the end of the trainer log: all of it, one rank's lines or the launcher's, only lines containing `q` */
  log: (id: number, lines = 200, filter: LogFilter = {}) =>
    request<{ lines: string[]; ranks: number }>("GET", `/api/runs/${id}/log?${logParams(filter, lines)}`),
  /** the same lines, all of them, as a file (the session cookie authorises the plain link) */
  logDownloadUrl: (id: number, filter: LogFilter = {}) => `/api/runs/${id}/log/download?${logParams(filter)}`,
  metricNames: (id: number) => request<string[]>("GET", `/api/runs/${id}/metrics/names`),
  metrics: (id: number, name: string, points = 1000, start?: number, end?: number) => {
    const p = new URLSearchParams({ name, points: String(points) });
    if (start !== undefined) p.set("start", String(Math.floor(start)));
    if (end !== undefined) p.set("end", String(Math.ceil(end)));
    return request<MetricQuery>("GET", `/api/runs/${id}/metrics?${p}`);
  },
};
