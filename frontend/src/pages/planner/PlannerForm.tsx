import { createContext, useContext, type ReactNode } from "react";
import type { Catalog, FieldError } from "../../lib/api";
import { fmtCount, fmtSeq, parseSeq } from "../../lib/format";
import { CUSTOM_GPU, effectiveDp, GPU_COLUMNS, worldSize, type PlanForm } from "./form";

type Props = {
  form: PlanForm;
  setForm: (f: PlanForm) => void;
  catalog: Catalog | null;
  errors: FieldError[];
  warnings?: FieldError[];
  /** allowed values of the select fields, from the plan model (GET /api/plans/defaults) */
  choices: Record<string, unknown[]>;
};

/** The estimate's warnings ({field, message}), shown beside their fields like errors but in amber. */
const WarningsContext = createContext<FieldError[]>([]);

export const FORM_FIELDS = [
  "model.preset", "model.config", "hardware.gpu", "hardware.num_nodes", "hardware.gpus_per_node",
  "hardware.cpu_memory_gib_per_node", "training.seq_len", "parallel.sp_size", "parallel.dp_size",
  "training.micro_batch_size", "training.grad_accum", "training.dtype", "training.zero_stage",
  "training.attn_implementation", "training.offload_optimizer", "training.offload_params",
  "training.activation_checkpointing", "training.checkpoint_offload", "training.tiled_mlp", "training.tiled_logits_loss",
  "training.liger_kernel", "training.expandable_segments", "training.seq_parallel_communication_data_type",
  "training.document_len",
];

/** Errors naming this field (or a sub-path of it, e.g. model.config.num_attention_heads). */
function errorsFor(errors: FieldError[], field: string): FieldError[] {
  return errors.filter((e) => e.field === field || e.field.startsWith(field + "."));
}

function Field({ label, field, errors, hint, children }: {
  label: string; field: string; errors: FieldError[]; hint?: ReactNode; children: ReactNode;
}) {
  const mine = errorsFor(errors, field);
  const warned = errorsFor(useContext(WarningsContext), field);
  return (
    <label className={`field ${mine.length ? "has-error" : ""}`}>
      <span className="field-label">{label}</span>
      {children}
      {hint ? <span className="field-hint muted">{hint}</span> : null}
      {mine.length ? (
        <span className="field-error" data-testid={`field-error-${field}`} role="alert">
          {mine.map((e) => e.message).join("; ")}
        </span>
      ) : null}
      {warned.length && !mine.length ? (
        <span className="field-warning" data-testid={`field-warning-${field}`}>{warned.map((e) => e.message).join("; ")}</span>
      ) : null}
    </label>
  );
}

export function PlannerForm({ form, setForm, catalog, errors, warnings = [], choices }: Props) {
  const options = (field: string) => (choices[field] ?? []).map((v) => <option key={String(v)}>{String(v)}</option>);
  const set = <K extends keyof PlanForm>(k: K, v: PlanForm[K]) => setForm({ ...form, [k]: v });
  const text = (k: keyof PlanForm, testid: string, inputMode: "numeric" | "text" = "numeric") => (
    <input
      data-testid={testid}
      inputMode={inputMode}
      value={String(form[k])}
      onChange={(e) => set(k, e.target.value as never)}
    />
  );
  const check = (k: keyof PlanForm, label: string) => {
    const mine = errorsFor(errors, `training.${k}`);
    return (
      <div className="switch-wrap">
        <label className="switch">
          <input type="checkbox" data-testid={`input-${k}`} checked={Boolean(form[k])} onChange={(e) => set(k, e.target.checked as never)} />
          {label}
        </label>
        {mine.length ? (
          <span className="field-error" data-testid={`field-error-training.${k}`} role="alert">{mine.map((e) => e.message).join("; ")}</span>
        ) : null}
        {errorsFor(warnings, `training.${k}`).map((w, i) => (
          <span key={i} className="field-warning" data-testid={`field-warning-training.${k}`}>{w.message}</span>
        ))}
      </div>
    );
  };
  const seq = parseSeq(form.seq_len);
  const models = catalog?.models ?? [{ name: form.preset }];
  const gpus = catalog?.gpus ?? [{ name: form.gpu, memory_gib: 0 }];

  // Switching to "custom" starts from the figures of the GPU that was selected.
  const pickGpu = (name: string) => {
    if (name !== CUSTOM_GPU) return set("gpu", name);
    const base = catalog?.gpus.find((g) => g.name === form.gpu);
    const customGpu = base
      ? Object.fromEntries([["name", `custom-${base.name}`], ...GPU_COLUMNS.map((c) => [c, String(base[c])])])
      : form.customGpu;
    setForm({ ...form, gpu: CUSTOM_GPU, customGpu });
  };
  const onUpload = async (file: File | undefined) => {
    if (!file) return;
    setForm({ ...form, modelMode: "config", configText: await file.text() });
  };

  return (
    <WarningsContext.Provider value={warnings}>
    <form className="planner-form card" data-testid="planner-form" onSubmit={(e) => e.preventDefault()}>
      <fieldset>
        <legend>Model</legend>
        <div className="seg">
          <label><input type="radio" checked={form.modelMode === "preset"} onChange={() => set("modelMode", "preset")} data-testid="model-mode-preset" /> preset</label>
          <label><input type="radio" checked={form.modelMode === "config"} onChange={() => set("modelMode", "config")} data-testid="model-mode-config" /> config.json</label>
        </div>
        {form.modelMode === "preset" ? (
          <Field label="Preset" field="model.preset" errors={errors}>
            <select data-testid="input-preset" value={form.preset} onChange={(e) => set("preset", e.target.value)}>
              {models.map((m) => <option key={m.name} value={m.name}>{m.name}</option>)}
            </select>
          </Field>
        ) : (
          <Field label="config.json (paste or upload)" field="model.config" errors={errors}>
            <textarea data-testid="input-config" rows={8} value={form.configText} onChange={(e) => set("configText", e.target.value)} spellCheck={false} />
            <input type="file" accept=".json,application/json" data-testid="input-config-file" onChange={(e) => onUpload(e.target.files?.[0])} />
          </Field>
        )}
      </fieldset>

      <fieldset>
        <legend>Hardware</legend>
        <div className="grid3">
          <Field label="GPU" field="hardware.gpu" errors={errors}>
            <select data-testid="input-gpu" value={form.gpu} onChange={(e) => pickGpu(e.target.value)}>
              {gpus.map((g) => <option key={g.name} value={g.name}>{g.name}</option>)}
              <option value={CUSTOM_GPU}>custom…</option>
            </select>
          </Field>
          <Field label="Nodes" field="hardware.num_nodes" errors={errors}>{text("num_nodes", "input-num_nodes")}</Field>
          <Field label="GPUs / node" field="hardware.gpus_per_node" errors={errors}>{text("gpus_per_node", "input-gpus_per_node")}</Field>
        </div>
        {form.gpu === CUSTOM_GPU ? (
          <div className="grid3 custom-gpu" data-testid="custom-gpu">
            {["name", ...GPU_COLUMNS].map((c) => (
              <label key={c} className="field">
                <span className="field-label">{c.replace(/_/g, " ")}</span>
                <input data-testid={`input-gpu-${c}`} value={form.customGpu[c] ?? ""}
                  onChange={(e) => set("customGpu", { ...form.customGpu, [c]: e.target.value })} />
              </label>
            ))}
          </div>
        ) : null}
        <Field label="CPU memory / node (GiB)" field="hardware.cpu_memory_gib_per_node" errors={errors}>
          {text("cpu_memory_gib_per_node", "input-cpu_memory_gib_per_node")}
        </Field>
      </fieldset>

      <fieldset>
        <legend>Parallelism and sequence</legend>
        <div className="grid3">
          <Field label="seq_len" field="training.seq_len" errors={errors} hint={Number.isFinite(seq) ? `${fmtCount(seq)} tokens (${fmtSeq(seq)})` : "e.g. 128K, 1M"}>
            {text("seq_len", "input-seq_len", "text")}
          </Field>
          <Field label="sp_size" field="parallel.sp_size" errors={errors}>{text("sp_size", "input-sp_size")}</Field>
          <Field label="dp_size" field="parallel.dp_size" errors={errors} hint={`world ${worldSize(form) || "?"} = sp × dp`}>
            {form.autoDp ? <input data-testid="input-dp_size" value={String(effectiveDp(form))} disabled /> : text("dp_size", "input-dp_size")}
          </Field>
        </div>
        {check("autoDp", "dp = GPUs ÷ sp")}
        <div className="grid3">
          <Field label="micro batch" field="training.micro_batch_size" errors={errors}>{text("micro_batch_size", "input-micro_batch_size")}</Field>
          <Field label="grad accum" field="training.grad_accum" errors={errors}>{text("grad_accum", "input-grad_accum")}</Field>
          <Field label="dtype" field="training.dtype" errors={errors}>
            <select data-testid="input-dtype" value={form.dtype} onChange={(e) => set("dtype", e.target.value)}>
              {options("training.dtype")}
            </select>
          </Field>
        </div>
      </fieldset>

      <fieldset>
        <legend>Memory savers</legend>
        <div className="grid2">
          <Field label="ZeRO stage" field="training.zero_stage" errors={errors}>
            <select data-testid="input-zero_stage" value={form.zero_stage} onChange={(e) => set("zero_stage", e.target.value)}>
              {options("training.zero_stage")}
            </select>
          </Field>
          <Field label="attention" field="training.attn_implementation" errors={errors}>
            <select data-testid="input-attn" value={form.attn_implementation} onChange={(e) => set("attn_implementation", e.target.value)}>
              {options("training.attn_implementation")}
            </select>
          </Field>
        </div>
        <div className="switches">
          {check("offload_optimizer", "offload optimizer")}
          {check("offload_params", "offload params")}
          {check("activation_checkpointing", "activation checkpointing")}
          {check("checkpoint_offload", "checkpoint offload")}
          {check("tiled_mlp", "tiled MLP")}
          {check("tiled_logits_loss", "tiled logits+loss")}
          {check("liger_kernel", "Liger kernels")}
          {check("expandable_segments", "expandable segments")}
        </div>
        <div className="grid2">
          <Field label="SP gradient dtype" field="training.seq_parallel_communication_data_type" errors={errors}>
            <select data-testid="input-comm_dtype" value={form.seq_parallel_communication_data_type}
              onChange={(e) => set("seq_parallel_communication_data_type", e.target.value)}>
              {options("training.seq_parallel_communication_data_type")}
            </select>
          </Field>
          <Field label="document length" field="training.document_len" errors={errors} hint="packed documents; empty: whole sequences">
            {text("document_len", "input-document_len", "text")}
          </Field>
        </div>
      </fieldset>
    </form>
    </WarningsContext.Provider>
  );
}
