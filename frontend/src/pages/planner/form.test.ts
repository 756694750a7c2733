import { describe, expect, it } from "vitest";
import example from "../../../../examples/tiny-llama-sp2.json";
import type { PlanDefaults } from "../../lib/api";
import {
  buildPlan, CUSTOM_GPU, decodePlanParam, effectiveDp, encodePlanParam, fmtSeqInput, planToForm, TINY_EXAMPLE,
  type PlanForm,
} from "./form";

// The defaults a loaded plan's missing fields take (GET /api/plans/defaults answers the plan model's own; these are
// the ones the tests below need, with plan/model.py's values).
const DEFAULTS: PlanDefaults = {
  plan: { model: { preset: "llama-3.1-8b" } },
  choices: {},
  defaults: {
    hardware: { num_nodes: 1, cpu_memory_gib_per_node: 1024 },
    parallel: { sp_size: 1, dp_size: 1 },
    training: {
      micro_batch_size: 1, grad_accum: 1, dtype: "bf16", zero_stage: 3, offload_optimizer: false, offload_params: false,
      activation_checkpointing: true, checkpoint_offload: false, tiled_mlp: false, tiled_logits_loss: false,
      attn_implementation: "sdpa", liger_kernel: false, expandable_segments: true,
      seq_parallel_communication_data_type: "fp32",
    },
  },
};

const tinyForm = (): PlanForm => planToForm(TINY_EXAMPLE, DEFAULTS).form;

describe("TINY_EXAMPLE", () => {
  it("is examples/tiny-llama-sp2.json itself", () => {
    expect(TINY_EXAMPLE).toEqual(example);
  });
});

describe("planToForm and buildPlan", () => {
  it("round-trip the example plan", () => {
    const { form, run } = planToForm(TINY_EXAMPLE, DEFAULTS);
    expect(run).toEqual(example.run);
    expect(form.modelMode).toBe("config");
    expect(form.seq_len).toBe("512");
    expect(form.autoDp).toBe(true);  // sp 2 x dp 1 fills the 2 GPUs
    const built = buildPlan(form);
    expect(built.localErrors).toEqual([]);
    expect(built.plan).toMatchObject({
      model: example.model, hardware: example.hardware, parallel: example.parallel, training: example.training,
    });
  });

  it("fills what the plan leaves out from the defaults", () => {
    const { form } = planToForm({ model: { preset: "tiny" }, hardware: { gpu: "H100-80GB", gpus_per_node: 8 },
      training: { seq_len: 131072 } }, DEFAULTS);
    expect(form.num_nodes).toBe("1");
    expect(form.zero_stage).toBe("3");
    expect(form.dtype).toBe("bf16");
    expect(form.seq_len).toBe("128K");
    expect(form.autoDp).toBe(false);  // sp 1 x dp 1 leaves 7 of 8 GPUs
  });

  it("refuses what is not a plan", () => {
    expect(() => planToForm("text", DEFAULTS)).toThrow("a plan must be a JSON object");
    expect(() => planToForm({ model: {} }, DEFAULTS)).toThrow("a plan needs model, hardware and training");
  });

  it("names the field of each local error and builds no plan", () => {
    const bad = buildPlan({ ...tinyForm(), seq_len: "lots", sp_size: "2.5" });
    expect(bad.plan).toBeNull();
    expect(bad.localErrors.map((e) => e.field)).toEqual(["training.seq_len", "parallel.sp_size"]);

    const json = buildPlan({ ...tinyForm(), configText: "{not json" });
    expect(json.localErrors[0].field).toBe("model.config");
    expect(json.localErrors[0].message).toMatch(/^config\.json is not valid JSON/);

    const doc = buildPlan({ ...tinyForm(), document_len: "a few" });
    expect(doc.localErrors.map((e) => e.field)).toEqual(["training.document_len"]);
  });

  it("checks a custom GPU's columns and builds it", () => {
    const base = { ...tinyForm(), gpu: CUSTOM_GPU };
    const bad = buildPlan({ ...base, customGpu: { ...base.customGpu, name: "mine", memory_gib: "0" } });
    expect(bad.localErrors.map((e) => e.field)).toContain("hardware.gpu.memory_gib");
    const ok = buildPlan({ ...base, customGpu: { name: "mine", memory_gib: "96", hbm_tb_per_s: "4", bf16_dense_tflops: "1000",
      nvlink_gb_per_s_per_direction: "450", typical_internode_gb_per_s: "50" } });
    expect(ok.plan?.hardware.gpu).toEqual({ name: "mine", memory_gib: 96, hbm_tb_per_s: 4, bf16_dense_tflops: 1000,
      nvlink_gb_per_s_per_direction: 450, typical_internode_gb_per_s: 50 });
  });

  it("reads a seq_len written with K or M", () => {
    expect(buildPlan({ ...tinyForm(), seq_len: "64K" }).plan?.training.seq_len).toBe(65536);
    expect(buildPlan({ ...tinyForm(), document_len: "4K" }).plan?.training.document_len).toBe(4096);
  });
});

describe("effectiveDp", () => {
  it("fills the GPUs when automatic, else takes the form's value", () => {
    const f = { ...tinyForm(), gpus_per_node: "8", num_nodes: "2", sp_size: "4", autoDp: true };
    expect(effectiveDp(f)).toBe(4);
    expect(effectiveDp({ ...f, sp_size: "3" })).toBe(1);  // 16 GPUs do not split into sp 3
    expect(effectiveDp({ ...f, autoDp: false, dp_size: "2" })).toBe(2);
  });
});

describe("plans in links", () => {
  it("survive the trip through a URL-safe parameter, non-ASCII names included", () => {
    const plan = { ...TINY_EXAMPLE, name: "Ulysses — 长上下文" };
    const param = encodePlanParam(plan);
    expect(param).toMatch(/^[A-Za-z0-9_-]+$/);
    expect(decodePlanParam(param)).toEqual(plan);
  });
  it("write seq_len as K where exact", () => {
    expect(fmtSeqInput(131072)).toBe("128K");
    expect(fmtSeqInput(1000)).toBe("1000");
  });
});
