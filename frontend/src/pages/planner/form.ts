import type { CustomGpu, Plan } from "../../lib/api";
import { parseSeq } from "../../lib/format";

// What the planner form edits; strings where the user types free text.
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
};

export const DEFAULT_FORM: PlanForm = {
  modelMode: "preset",
  preset: "Qwen/Qwen3-4B",
  configText: JSON.stringify(
    {
      model_type: "llama",
      hidden_size: 64,
      num_hidden_layers: 2,
      num_attention_heads: 4,
      num_key_value_heads: 4,
      intermediate_size: 128,
      vocab_size: 256,
    },
    null,
    2,
  ),
  gpu: "H100-80GB",
  customGpu: {
    name: "my-gpu", memory_gib: "96", hbm_tb_per_s: "4", bf16_dense_tflops: "1000",
    nvlink_gb_per_s_per_direction: "450", typical_internode_gb_per_s: "50",
  },
  num_nodes: "1",
  gpus_per_node: "4",
  cpu_memory_gib_per_node: "1900",
  seq_len: "64K",
  sp_size: "4",
  dp_size: "1",
  autoDp: true,
  micro_batch_size: "1",
  grad_accum: "8",
  dtype: "bf16",
  zero_stage: "3",
  offload_optimizer: true,
  offload_params: false,
  activation_checkpointing: true,
  checkpoint_offload: false,
  tiled_mlp: false,
  tiled_logits_loss: false,
  attn_implementation: "flash_attention_2",
};

function int(s: string): number {
  const v = Number(s.trim());
  return Number.isFinite(v) ? Math.trunc(v) : NaN;
}

export const CUSTOM_GPU = "__custom__";
export const GPU_COLUMNS = ["memory_gib", "hbm_tb_per_s", "bf16_dense_tflops", "nvlink_gb_per_s_per_direction", "typical_internode_gb_per_s"];

export function worldSize(f: PlanForm): number {
  return int(f.gpus_per_node) * (int(f.num_nodes) || 1);
}

export function effectiveDp(f: PlanForm): number {
  if (!f.autoDp) return int(f.dp_size);
  const sp = int(f.sp_size);
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
  const numbers: [keyof PlanForm, string][] = [
    ["num_nodes", "hardware.num_nodes"],
    ["gpus_per_node", "hardware.gpus_per_node"],
    ["sp_size", "parallel.sp_size"],
    ["micro_batch_size", "training.micro_batch_size"],
    ["grad_accum", "training.grad_accum"],
  ];
  if (!f.autoDp) numbers.push(["dp_size", "parallel.dp_size"]);
  for (const [k, field] of numbers) {
    if (!/^\s*\d+\s*$/.test(String(f[k]))) localErrors.push({ field, message: "must be a whole number" });
  }
  if (localErrors.length) return { plan: null, localErrors };
  let gpu: Plan["hardware"]["gpu"] = f.gpu;
  if (f.gpu === CUSTOM_GPU) {
    const custom: CustomGpu = { name: f.customGpu.name || "custom" };
    for (const c of GPU_COLUMNS) {
      const v = Number(f.customGpu[c]);
      if (!Number.isFinite(v) || v <= 0) localErrors.push({ field: `hardware.gpu.${c}`, message: `${c} must be a positive number` });
      custom[c] = v;
    }
    if (localErrors.length) return { plan: null, localErrors };
    gpu = custom;
  }
  const cpu = Number(f.cpu_memory_gib_per_node);
  const plan: Plan = {
    model,
    hardware: {
      gpu,
      gpus_per_node: int(f.gpus_per_node),
      num_nodes: int(f.num_nodes),
      ...(Number.isFinite(cpu) && cpu > 0 ? { cpu_memory_gib_per_node: cpu } : {}),
    },
    parallel: { sp_size: int(f.sp_size), dp_size: effectiveDp(f) },
    training: {
      seq_len: seq,
      micro_batch_size: int(f.micro_batch_size),
      grad_accum: int(f.grad_accum),
      dtype: f.dtype,
      zero_stage: int(f.zero_stage),
      offload_optimizer: f.offload_optimizer,
      offload_params: f.offload_params,
      activation_checkpointing: f.activation_checkpointing,
      checkpoint_offload: f.checkpoint_offload,
      tiled_mlp: f.tiled_mlp,
      tiled_logits_loss: f.tiled_logits_loss,
      attn_implementation: f.attn_implementation,
    },
  };
  return { plan, localErrors };
}

/** The GPU layout the sweep uses for a world size (mirrors the planner's _hardware_for_world). */
export function hardwareForWorld(f: PlanForm, world: number): Pick<PlanForm, "gpus_per_node" | "num_nodes"> {
  const perNode = int(f.gpus_per_node) > 0 ? int(f.gpus_per_node) : 8;
  if (world <= perNode || world % perNode) return { gpus_per_node: String(world), num_nodes: "1" };
  return { gpus_per_node: String(perNode), num_nodes: String(world / perNode) };
}

type RunSection = { steps?: number; learning_rate?: number; data?: { path?: string } };
export type Loaded = { form: PlanForm; run: RunSection | null };

/** A plan-v1 object (optionally with a trainer-v1 `run` section) back into the form. */
export function planToForm(obj: unknown): Loaded {
  if (!obj || typeof obj !== "object") throw new Error("a plan must be a JSON object");
  const p = obj as Partial<Plan> & { run?: RunSection };
  if (!p.model || !p.hardware || !p.parallel || !p.training) throw new Error("a plan needs model, hardware, parallel and training");
  const t = { ...DEFAULT_FORM, ...Object.fromEntries(Object.entries(p.training).map(([k, v]) => [k, typeof v === "boolean" ? v : String(v)])) };
  const g = p.hardware.gpu as unknown;
  const gpu = typeof g === "string" ? g : CUSTOM_GPU;
  const customGpu = g && typeof g === "object"
    ? Object.fromEntries(Object.entries(g as Record<string, unknown>).map(([k, v]) => [k, String(v)]))
    : DEFAULT_FORM.customGpu;
  const world = p.hardware.gpus_per_node * (p.hardware.num_nodes ?? 1);
  const form: PlanForm = {
    ...(t as PlanForm),
    modelMode: p.model.config ? "config" : "preset",
    preset: p.model.preset ?? DEFAULT_FORM.preset,
    configText: p.model.config ? JSON.stringify(p.model.config, null, 2) : DEFAULT_FORM.configText,
    gpu,
    customGpu,
    num_nodes: String(p.hardware.num_nodes ?? 1),
    gpus_per_node: String(p.hardware.gpus_per_node),
    cpu_memory_gib_per_node: String(p.hardware.cpu_memory_gib_per_node ?? DEFAULT_FORM.cpu_memory_gib_per_node),
    seq_len: String(p.training.seq_len),
    sp_size: String(p.parallel.sp_size),
    dp_size: String(p.parallel.dp_size),
    autoDp: p.parallel.sp_size * p.parallel.dp_size === world,
  };
  return { form, run: p.run ?? null };
}

/** Mirrors examples/tiny-llama-sp2.json: trains on two CPU ranks in about a minute. */
export const TINY_EXAMPLE = {
  model: { config: { model_type: "llama", hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2,
    intermediate_size: 128, vocab_size: 512, max_position_embeddings: 2048 } },
  hardware: { gpu: "H100-80GB", gpus_per_node: 2, num_nodes: 1 },
  parallel: { sp_size: 2, dp_size: 1 },
  training: { seq_len: 512, micro_batch_size: 1, grad_accum: 1, dtype: "fp32", zero_stage: 2, offload_optimizer: false,
    offload_params: false, activation_checkpointing: false, checkpoint_offload: false, tiled_mlp: false,
    tiled_logits_loss: false, attn_implementation: "sdpa" },
  run: { steps: 20, learning_rate: 1e-3, data: { path: "examples/data/sample.txt" } },
};

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
