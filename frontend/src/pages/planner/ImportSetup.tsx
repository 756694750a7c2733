import { useState } from "react";
import { ApiError, client, unwrap, type FieldError, type PlanDefaults, type PlanImported } from "../../lib/api";
import { fmtGiB, fmtNum, fmtSeq } from "../../lib/format";
import { verdictBadge } from "../../lib/verdict";
import { planToForm, type Loaded } from "./form";

type Notes = { kind: "errors" | "warnings" | "defaults"; notes: FieldError[] };

function NoteList({ kind, notes }: Notes) {
  if (!notes.length) return null;
  const cls = kind === "errors" ? "card error" : kind === "warnings" ? "card warn" : "card muted";
  const title = kind === "errors" ? "Errors" : kind === "warnings" ? "Read by nothing" : "Left to defaults";
  return (
    <div className={cls} data-testid={`import-${kind}`}>
      <b>{title} ({notes.length})</b>
      {notes.map((n, i) => (
        <div key={i} data-testid={`import-${kind.slice(0, -1)}`} data-field={n.field}>
          {kind === "errors" ? "✖ " : kind === "warnings" ? "⚠ " : "· "}<code>{n.field}</code>: {n.message}
        </div>
      ))}
    </div>
  );
}

/** "Paste your DeepSpeed config / launch line": the setup a user already has, as a plan (POST /api/plans/import),
 * with what their libraries would really do with it, and the estimate, before anything is loaded into the form. */
export function ImportSetup({ onLoad, defaults }: { onLoad: (l: Loaded) => void; defaults: PlanDefaults }) {
  const [ds, setDs] = useState("");
  const [launch, setLaunch] = useState("");
  const [acc, setAcc] = useState("");
  const [args, setArgs] = useState("");
  const [gpusPerNode, setGpusPerNode] = useState("8");
  const [out, setOut] = useState<PlanImported | null>(null);
  const [failed, setFailed] = useState<FieldError[]>([]);
  const [busy, setBusy] = useState(false);
  const run = async () => {
    setBusy(true);
    try {
      setOut(await unwrap(client.POST("/api/plans/import", { body: {
        ds_config: ds.trim() || null, launch: launch.trim() || null, accelerate_config: acc.trim() || null,
        training_args: args.trim() || null, gpus_per_node: Number(gpusPerNode) || null,
      } })));
      setFailed([]);
    } catch (e) {
      setOut(null);
      setFailed(e instanceof ApiError && e.fields.length ? e.fields : [{ field: "import", message: (e as Error).message }]);
    }
    setBusy(false);
  };
  const p = out?.plan as Record<string, Record<string, unknown>> | undefined;
  const est = out?.estimate;
  return (
    <details className="card import-setup" data-testid="import-setup">
      <summary>Paste your DeepSpeed config / launch line</summary>
      <label className="muted">ds_config.json</label>
      <textarea rows={8} data-testid="import-ds-config" value={ds} onChange={(e) => setDs(e.target.value)} spellCheck={false}
        placeholder='{"zero_optimization": {"stage": 3}, "bf16": {"enabled": true}, ...}' />
      <label className="muted">Launch line</label>
      <textarea rows={2} data-testid="import-launch" value={launch} onChange={(e) => setLaunch(e.target.value)} spellCheck={false}
        placeholder="deepspeed --num_gpus=8 train.py --deepspeed ds_config.json --model_name_or_path ..." />
      <details>
        <summary className="muted">Accelerate config / TrainingArguments</summary>
        <textarea rows={6} data-testid="import-accelerate" value={acc} onChange={(e) => setAcc(e.target.value)} spellCheck={false}
          placeholder="accelerate config YAML (distributed_type: DEEPSPEED, parallelism_config: ...)" />
        <textarea rows={4} data-testid="import-training-args" value={args} onChange={(e) => setArgs(e.target.value)} spellCheck={false}
          placeholder='TrainingArguments as JSON {"per_device_train_batch_size": 1, ...}' />
      </details>
      <div className="buttons" style={{ margin: "8px 0" }}>
        <label>GPUs per node <input type="number" min={1} style={{ width: 60 }} data-testid="import-gpus-per-node" value={gpusPerNode}
          onChange={(e) => setGpusPerNode(e.target.value)} /></label>
        <button type="button" data-testid="import-run" disabled={busy || !(ds.trim() || launch.trim() || acc.trim() || args.trim())}
          onClick={run}>Import</button>
      </div>
      {failed.length ? (
        <div className="card error" data-testid="import-failed">
          {failed.map((f, i) => <div key={i}><code>{f.field}</code>: {f.message}</div>)}
        </div>
      ) : null}
      {out && p ? (
        <div data-testid="import-result">
          <div className="card" data-testid="import-plan">
            <b>Plan</b>: {String((p.model as Record<string, unknown>).preset ?? "custom model")} on {String(p.hardware.num_nodes)} ×{" "}
            {String(p.hardware.gpus_per_node)} {String(p.hardware.gpu)}, sp {String(p.parallel.sp_size)} × dp {String(p.parallel.dp_size)},
            seq {fmtSeq(Number(p.training?.seq_len ?? 0))}, ZeRO-{String(p.training.zero_stage)} {String(p.training.dtype)}
            {p.training.offload_optimizer ? ", optimizer offload" : ""}{p.training.offload_params ? ", parameter offload" : ""}
            {est?.valid && est.memory && est.throughput ? (
              <div data-testid="import-estimate">
                <b>Estimate</b>: {fmtGiB(est.memory.device_total_gib)} per GPU,{" "}
                <span className={`badge ${verdictBadge(est.memory).cls}`} data-testid="import-verdict">{est.memory.verdict_text}</span>,{" "}
                {fmtNum(est.throughput.tokens_per_s)} tokens/s
              </div>
            ) : est ? <div data-testid="import-estimate">Estimate: not valid ({est.errors.map((e) => e.field).join(", ")})</div> : null}
          </div>
          <NoteList kind="errors" notes={out.errors} />
          <NoteList kind="warnings" notes={out.warnings} />
          <NoteList kind="defaults" notes={out.defaults} />
          <button type="button" data-testid="import-load" onClick={() => onLoad(planToForm(out.plan, defaults))}>Load into the form</button>
        </div>
      ) : null}
    </details>
  );
}
