// Typed client for the HTTP API v1 (docs/api.md). All paths are relative so the API can serve the build.

export type Plan = {
  model: { preset?: string; config?: Record<string, unknown> };
  hardware: { gpu: string | CustomGpu; gpus_per_node: number; num_nodes?: number; cpu_memory_gib_per_node?: number };
  parallel: { sp_size: number; dp_size: number };
  training: {
    seq_len: number;
    micro_batch_size: number;
    grad_accum: number;
    dtype: string;
    zero_stage: number;
    offload_optimizer: boolean;
    offload_params: boolean;
    activation_checkpointing: boolean;
    checkpoint_offload: boolean;
    tiled_mlp: boolean;
    tiled_logits_loss: boolean;
    attn_implementation: string;
  };
};

/** A GPU not in the catalog: the columns of gpus.csv. */
export type CustomGpu = { name: string; [column: string]: string | number };

export function gpuName(gpu: string | CustomGpu | undefined): string {
  return gpu === undefined ? "–" : typeof gpu === "string" ? gpu : `${gpu.name} (custom)`;
}

export type FieldError = { field: string; message: string };

export type Estimate = {
  valid: boolean;
  errors: FieldError[];
  warnings: (string | FieldError)[];
  memory: null | {
    peak_allocated_gib: number;
    device_total_gib: number;
    gpu_capacity_gib: number;
    fits: boolean;
    breakdown_gib: Record<string, number>;
    cpu_gib_per_node: number;
    cpu_fits: boolean;
  };
  throughput: null | {
    step_time_s: number;
    tokens_per_s: number;
    tokens_per_s_per_gpu: number;
    tflops_per_gpu: number;
    mfu: number;
    time_breakdown_s?: Record<string, number>;
  };
};

export type SweepSeries = {
  sp_size: number;
  peak_allocated_gib: (number | null)[];
  device_total_gib: (number | null)[];
  tokens_per_s: (number | null)[];
  fits: (boolean | null)[];
  max_seq_len: number | null;
  valid?: boolean;
  gpus?: number;
  errors?: FieldError[];
};
export type Sweep = { seq_lens: number[]; series: SweepSeries[]; gpu_capacity_gib: number };
export type Export = { accelerate_yaml: string; deepspeed_json: string; launch_command: string };
export type Catalog = {
  models: { name: string; num_attention_heads?: number; [k: string]: unknown }[];
  gpus: { name: string; memory_gib: number; [k: string]: unknown }[];
};
export type StoredPlan = { id: number; name: string; created_at: string; plan: Plan; estimate: Estimate };

export type RunState =
  | "pending_approval" | "queued" | "starting" | "running"
  | "succeeded" | "failed" | "oom" | "cancelled" | "lost";

export type Run = {
  id: number;
  name: string;
  state: RunState;
  plan_id: number;
  spec: Plan & { run?: Record<string, unknown> & { steps?: number } };
  estimate: Estimate | null;
  worker: string | null;
  attempt: number;
  cancel_requested: boolean;
  created_at: string;
  approved_at: string | null;
  started_at: string | null;
  finished_at: string | null;
  heartbeat_at: string | null;
  exit_reason: string | null;
  last_step: number | null;
  steps: number | null;
  attempts?: Attempt[];
  max_retries?: number;
  priority?: number;
  submitted_by?: number | null;
  approved_by?: number | null;
  forced?: boolean;
};

export type Attempt = {
  attempt: number; state: RunState; worker: string | null; started_at: string | null; finished_at: string | null;
  last_step: number; exit_reason: string | null;
};

export type Role = "viewer" | "submitter" | "approver" | "admin" | "worker";
export type Identity = { name: string; role: Role; token_id: number | null };

/** Fired on any 401 so the app can offer sign-in (the token lives in an httpOnly cookie). */
export const UNAUTHORIZED_EVENT = "ulab:unauthorized";

export type MetricSeries = { rank: number; step: number[]; min: number[]; max: number[]; last: number[] };
export type MetricQuery = { name: string; series: MetricSeries[] };
export type StreamPoint = { rank: number; step: number; name: string; value: number };

export const TERMINAL: RunState[] = ["succeeded", "failed", "oom", "cancelled", "lost"];

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

export const api = {
  catalog: () => request<Catalog>("GET", "/api/catalog"),
  estimate: (plan: Plan, signal?: AbortSignal) => request<Estimate>("POST", "/api/estimate", plan, signal),
  maxSeq: (plan: Plan, signal?: AbortSignal) =>
    request<{ max_seq_len: number; estimate: Estimate }>("POST", "/api/estimate/max-seq", plan, signal),
  /** sp_sizes / seq_lens omitted: the planner picks the valid sp sizes and a grid up to the longest fit. */
  sweep: (plan: Plan, signal?: AbortSignal, sp_sizes?: number[], seq_lens?: number[]) =>
    request<Sweep>("POST", "/api/estimate/sweep", { plan, sp_sizes, seq_lens }, signal),
  exportPlan: (plan: Plan) => request<Export>("POST", "/api/estimate/export", plan),
  createPlan: (plan: Plan, name?: string) => request<StoredPlan>("POST", "/api/plans", { ...plan, name }),
  createRun: (plan_id: number, run: Record<string, unknown>, name?: string, extra?: { priority?: number; max_retries?: number }) =>
    request<Run>("POST", "/api/runs", { plan_id, name, run, ...extra }),
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
  /** the next attempt of the same run, resuming from its last checkpoint (approvers) */
  retry: (id: number) => request<Run>("POST", `/api/runs/${id}/retry`),
  log: (id: number, lines = 200) => request<{ lines: string[] }>("GET", `/api/runs/${id}/log?lines=${lines}`),
  metricNames: (id: number) => request<string[]>("GET", `/api/runs/${id}/metrics/names`),
  metrics: (id: number, name: string, points = 1000, start?: number, end?: number) => {
    const p = new URLSearchParams({ name, points: String(points) });
    if (start !== undefined) p.set("start", String(Math.floor(start)));
    if (end !== undefined) p.set("end", String(Math.ceil(end)));
    return request<MetricQuery>("GET", `/api/runs/${id}/metrics?${p}`);
  },
};
