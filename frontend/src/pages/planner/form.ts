import type { CustomGpu, Plan, PlanDefaults, RunSection } from "../../lib/api";
import tinyLlama from "../../../../examples/tiny-llama-sp2.json";
import { fmtSeq, parseSeq, parseWhole } from "../../lib/format";

type Training = NonNullable<Plan["training"]>;

// What the planner form edits; strings where the user types free text. Its starting values and the defaults of
// fields a loaded plan leaves out come from the API (GET /api/plans/defaults: the plan model's own defaults).
export type PlanForm = {
  modelMode: "preset" | "config";
  preset: string;
  configText: string;
  gpu: string;
  /** used when gpu === CUSTOM_GPU: the columns of gpus.csv */
  customGpu: Record<string, string>;
  num_nodes: string;
  gpus_per_node: string;
  cpu_memory_gib_per_node: string;
  seq_len: string;
  sp_size: string;
  dp_size: string;
  autoDp: boolean;
  micro_batch_size: string;
  grad_accum: string;
  dtype: string;
  zero_stage: string;
  offload_optimizer: boolean;
  offload_params: boolean;
  activation_checkpointing: boolean;
  checkpoint_offload: boolean;
  tiled_mlp: boolean;
  tiled_logits_loss: boolean;
  attn_implementation: string;
  liger_kernel: boolean;
  expandable_segments: boolean;
  seq_parallel_communication_data_type: string;
  /** empty: every sequence is one document */
  document_len: string;
};

// Starting text of two widgets (not plan defaults): the config.json editor and the custom-GPU columns.
const CONFIG_TEMPLATE = JSON.stringify(
  { model_type: "llama", hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 4,
    intermediate_size: 128, vocab_size: 256 },
  null,
  2,
);
const CUSTOM_GPU_TEMPLATE: Record<string, string> = {
  name: "my-gpu", memory_gib: "96", hbm_tb_per_s: "4", bf16_dense_tflops: "1000",
  nvlink_gb_per_s_per_direction: "450", typical_internode_gb_per_s: "50",
};

export const CUSTOM_GPU = "__custom__";
export const GPU_COLUMNS = ["memory_gib", "hbm_tb_per_s", "bf16_dense_tflops", "nvlink_gb_per_s_per_direction",
  "typical_internode_gb_per_s"] as const;

export function worldSize(f: PlanForm): number {
  return parseWhole(f.gpus_per_node) * (parseWhole(f.num_nodes) || 1);
}

export function effectiveDp(f: PlanForm): number {
  if (!f.autoDp) return parseWhole(f.dp_size);
  const sp = parseWhole(f.sp_size);
  const w = worldSize(f);
  return sp > 0 && w % sp === 0 ? Math.max(1, w / sp) : 1;
}

export type Built = { plan: Plan | null; localErrors: { field: string; message: string }[] };

/** Turn the form into a plan-v1 object; problems the server cannot see (unparseable text) are local errors. */
export function buildPlan(f: PlanForm): Built {
  const localErrors: { field: string; message: string }[] = [];
  let model: Plan["model"] = { preset: f.preset };
  if (f.modelMode === "config") {
    try {
      const cfg = JSON.parse(f.configText);
      if (typeof cfg !== "object" || cfg === null || Array.isArray(cfg)) throw new Error("not an object");
      model = { config: cfg };
    } catch (e) {
      localErrors.push({ field: "model.config", message: `config.json is not valid JSON: ${(e as Error).message}` });
    }
  }
  const seq = parseSeq(f.seq_len);
  if (!Number.isFinite(seq)) localErrors.push({ field: "training.seq_len", message: "use a number, optionally with K or M (e.g. 128K)" });
  const doc = f.document_len.trim() ? parseSeq(f.document_len) : null;
  if (doc !== null && !Number.isFinite(doc)) localErrors.push({ field: "training.document_len", message: "use a number (e.g. 4K), or leave it empty" });
  const numbers: [keyof PlanForm, string][] = [
    ["num_nodes", "hardware.num_nodes"],
    ["gpus_per_node", "hardware.gpus_per_node"],
    ["sp_size", "parallel.sp_size"],
    ["micro_batch_size", "training.micro_batch_size"],
    ["grad_accum", "training.grad_accum"],
  ];
  if (!f.autoDp) numbers.push(["dp_size", "parallel.dp_size"]);
  for (const [k, field] of numbers) {
    if (!Number.isFinite(parseWhole(String(f[k])))) localErrors.push({ field, message: "must be a whole number" });
  }
  if (localErrors.length) return { plan: null, localErrors };
  let gpu: Plan["hardware"]["gpu"] = f.gpu;
  if (f.gpu === CUSTOM_GPU) {
    const figures = Object.fromEntries(GPU_COLUMNS.map((c) => [c, Number(f.customGpu[c])]));
    for (const c of GPU_COLUMNS) {
      if (!Number.isFinite(figures[c]) || figures[c] <= 0) localErrors.push({ field: `hardware.gpu.${c}`, message: `${c} must be a positive number` });
    }
    if (localErrors.length) return { plan: null, localErrors };
    gpu = { name: f.customGpu.name || "custom", ...figures } as CustomGpu;
  }
  const cpu = Number(f.cpu_memory_gib_per_node);
  const plan: Plan = {
    model,
    hardware: {
      gpu,
      gpus_per_node: parseWhole(f.gpus_per_node),
      num_nodes: parseWhole(f.num_nodes),
      ...(Number.isFinite(cpu) && cpu > 0 ? { cpu_memory_gib_per_node: cpu } : {}),
    },
    parallel: { sp_size: parseWhole(f.sp_size), dp_size: effectiveDp(f) },
    training: {
      seq_len: seq,
      micro_batch_size: parseWhole(f.micro_batch_size),
      grad_accum: parseWhole(f.grad_accum),
      dtype: f.dtype as Training["dtype"],
      zero_stage: parseWhole(f.zero_stage),
      offload_optimizer: f.offload_optimizer,
      offload_params: f.offload_params,
      activation_checkpointing: f.activation_checkpointing,
      checkpoint_offload: f.checkpoint_offload,
      tiled_mlp: f.tiled_mlp,
      tiled_logits_loss: f.tiled_logits_loss,
      attn_implementation: f.attn_implementation as Training["attn_implementation"],
      liger_kernel: f.liger_kernel,
      expandable_segments: f.expandable_segments,
      seq_parallel_communication_data_type: f.seq_parallel_communication_data_type as Training["seq_parallel_communication_data_type"],
      ...(doc !== null ? { document_len: doc } : {}),
    },
  };
  return { plan, localErrors };
}

export type Loaded = { form: PlanForm; run: RunSection | null };

/** seq_len as the form shows it: 64K where that is exact, else the number. */
export const fmtSeqInput = (n: number) => (/^[\d]+[KM]?$/.test(fmtSeq(n)) ? fmtSeq(n) : String(n));

/** A plan-v1 object (optionally with a trainer-v1 `run` section) back into the form; fields it leaves out take the
 * plan model's defaults (`d.defaults`, from the API). */
export function planToForm(obj: unknown, d: PlanDefaults): Loaded {
  if (!obj || typeof obj !== "object") throw new Error("a plan must be a JSON object");
  const p = obj as Partial<Plan>;
  if (!p.model || !p.hardware || !p.training) throw new Error("a plan needs model, hardware and training");
  const hw = { ...d.defaults.hardware, ...p.hardware } as Required<Plan["hardware"]>;
  const par = { ...d.defaults.parallel, ...p.parallel } as Required<NonNullable<Plan["parallel"]>>;
  const t = { ...d.defaults.training, ...p.training } as Required<Training>;
  const g = hw.gpu as unknown;
  const world = hw.gpus_per_node * hw.num_nodes;
  const form: PlanForm = {
    modelMode: p.model.config ? "config" : "preset",
    preset: p.model.preset ?? String((d.plan.model as { preset?: string }).preset ?? ""),
    configText: p.model.config ? JSON.stringify(p.model.config, null, 2) : CONFIG_TEMPLATE,
    gpu: typeof g === "string" ? g : CUSTOM_GPU,
    customGpu: g && typeof g === "object"
      ? Object.fromEntries(Object.entries(g as Record<string, unknown>).map(([k, v]) => [k, String(v)]))
      : CUSTOM_GPU_TEMPLATE,
    num_nodes: String(hw.num_nodes),
    gpus_per_node: String(hw.gpus_per_node),
    cpu_memory_gib_per_node: String(hw.cpu_memory_gib_per_node),
    seq_len: fmtSeqInput(t.seq_len),
    sp_size: String(par.sp_size),
    dp_size: String(par.dp_size),
    autoDp: par.sp_size * par.dp_size === world,
    micro_batch_size: String(t.micro_batch_size),
    grad_accum: String(t.grad_accum),
    dtype: t.dtype,
    zero_stage: String(t.zero_stage),
    offload_optimizer: t.offload_optimizer,
    offload_params: t.offload_params,
    activation_checkpointing: t.activation_checkpointing,
    checkpoint_offload: t.checkpoint_offload,
    tiled_mlp: t.tiled_mlp,
    tiled_logits_loss: t.tiled_logits_loss,
    attn_implementation: t.attn_implementation,
    liger_kernel: Boolean(t.liger_kernel),
    expandable_segments: Boolean(t.expandable_segments),
    seq_parallel_communication_data_type: t.seq_parallel_communication_data_type ?? "fp32",
    document_len: t.document_len ? fmtSeqInput(t.document_len) : "",
  };
  return { form, run: p.run ?? null };
}

/** examples/tiny-llama-sp2.json itself (bundled at build time): trains on two CPU ranks in about a minute. Its run
 * section comes with every field (the submit form keeps them). */
export const TINY_EXAMPLE = tinyLlama as Plan;

/** Handoff from a run page ("Open in planner") to the planner. */
export const LOAD_KEY = "ulab:load-plan";

/** Plans in links: #/planner?plan=<base64url of the plan JSON>. */
export function encodePlanParam(plan: unknown): string {
  const bytes = new TextEncoder().encode(JSON.stringify(plan));
  let bin = "";
  bytes.forEach((b) => (bin += String.fromCharCode(b)));
  return btoa(bin).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

export function decodePlanParam(param: string): unknown {
  const bin = atob(param.replace(/-/g, "+").replace(/_/g, "/"));
  return JSON.parse(new TextDecoder().decode(Uint8Array.from(bin, (c) => c.charCodeAt(0))));
}
