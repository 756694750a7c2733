// The HTTP API v1 (docs/api.md), through a client generated from its OpenAPI schema: `client.GET("/api/runs/{run_id}",
// ...)` checks the path, its parameters, the body and the answer against src/lib/schema.d.ts (npm run gen:
// openapi.json -> schema.d.ts, which FastAPI builds from the plan model, plan/model.py). All paths are relative so the
// API can serve the build.

import createClient, { type Middleware } from "openapi-fetch";
import type { components, paths } from "./schema";
import { shareAuth } from "./share";

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
export type RunState = Schemas["RunState"];
export type Attempt = Schemas["AttemptOut"];
export type Identity = Schemas["Identity"];
export type Role = Identity["role"];
export type MetricQuery = Schemas["MetricQueryOut"];
export type Checkpoint = Schemas["CheckpointOut"];
/** A stored plan: the API stores it with every default filled in. */
export type StoredPlan = Omit<Schemas["PlanOut"], "plan"> & { plan: Plan };
/** A run as the API answers it; its spec is the plan it runs, every default filled in. */
export type Run = Omit<Schemas["RunOut"], "spec"> & { spec: Plan };
/** One point of the run page's live stream (GET /api/runs/{id}/stream, event "metrics"). */
export type StreamPoint = Schemas["PointIn"] & { rank: number };

export function gpuName(gpu: string | CustomGpu | undefined): string {
  return gpu === undefined ? "–" : typeof gpu === "string" ? gpu : `${gpu.name ?? "custom"} (custom)`;
}

/** Fired on any 401 so the app can offer sign-in (the token lives in an httpOnly cookie). */
export const UNAUTHORIZED_EVENT = "ulab:unauthorized";

export class ApiError extends Error {
  status: number;
  fields: FieldError[];
  constructor(status: number, message: string, fields: FieldError[]) {
    super(message);
    this.status = status;
    this.fields = fields;
  }
}

/** The API's error text: ours is {detail: [{field, message}]} or {detail: "..."}; FastAPI's own validation is
 * {detail: [{loc, msg}]}. */
export function apiError(res: Response, body: unknown): ApiError {
  const detail = (body as { detail?: unknown } | null)?.detail;
  let fields: FieldError[] = [];
  let message = typeof body === "string" && body ? body : `${res.status} ${res.statusText}`;
  if (Array.isArray(detail)) {
    fields = detail.map((d: Record<string, unknown>) => ({
      field: String(d.field ?? (Array.isArray(d.loc) ? d.loc.filter((x) => x !== "body").join(".") : "")),
      message: String(d.message ?? d.msg ?? JSON.stringify(d)),
    }));
    message = fields.map((f) => (f.field ? `${f.field}: ${f.message}` : f.message)).join("; ");
  } else if (typeof detail === "string") {
    message = detail;
  }
  return new ApiError(res.status, message, fields);
}

const signInOffer: Middleware = {
  onResponse({ request, response }) {
    if (response.status === 401 && !new URL(request.url, window.location.href).pathname.startsWith("/api/session")) {
      window.dispatchEvent(new Event(UNAUTHORIZED_EVENT));
    }
    return undefined;
  },
};

/** The typed client: every path, parameter and body is checked against the generated schema. */
export const client = createClient<paths>({ baseUrl: "" });
client.use(signInOffer, shareAuth);

type Answer<T> = { data?: T; error?: unknown; response: Response };

/** The answer's data, or an ApiError carrying the API's own error text (and the fields it names). */
export async function unwrap<T>(call: Promise<Answer<T>>): Promise<T> {
  const { data, error, response } = await call;
  if (!response.ok) throw apiError(response, error);
  return data as T;
}

/** Which lines of a trainer log: one rank's (`rank`), the launcher's, and those containing `q`. */
export type LogFilter = { rank?: number; launcher?: boolean; q?: string };

/** The log's download link (a plain link: the session cookie authorises it), built from the same query the log
 * endpoint takes. */
export function logDownloadUrl(id: number, f: LogFilter): string {
  const p = new URLSearchParams();
  if (f.rank !== undefined) p.set("rank", String(f.rank));
  if (f.launcher) p.set("launcher", "true");
  if (f.q) p.set("q", f.q);
  return `/api/runs/${id}/log/download?${p}`;
}

/** A run the API answered: its spec is the stored plan it runs (every default filled in). */
export function unwrapRun(call: Promise<Answer<Schemas["RunOut"]>>): Promise<Run> {
  return unwrap(call) as Promise<Run>;
}
