import { useState } from "react";
import { ApiError, client, unwrap, unwrapRun, type Plan, type RunSection } from "../../lib/api";

const exportPlan = (plan: Plan) => unwrap(client.POST("/api/estimate/export", { body: plan }));
import { can, useAuth } from "../../lib/auth";
import { encodePlanParam } from "./form";
import { navigate } from "../../lib/route";

async function copyText(text: string): Promise<void> {
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    const ta = document.createElement("textarea");
    ta.value = text;
    document.body.appendChild(ta);
    ta.select();
    document.execCommand("copy");
    ta.remove();
  }
}

const EXPORTS = [
  ["accelerate_yaml", "Accelerate YAML"],
  ["deepspeed_json", "DeepSpeed JSON"],
  ["deepspeed_json_hf_trainer", "DeepSpeed JSON for the HF Trainer (\"auto\" values)"],
  ["launch_command", "launch command"],
  ["sbatch_script", "sbatch script"],
] as const;

/** Files to download: (export key, file name, button label, what the page says after). */
const DOWNLOADS = [
  ["plan_json", "plan.json", "plan.json", "plan.json downloaded (the launch command reads it)"],
  ["sbatch_script", "ulab-job.sbatch", "sbatch script", "ulab-job.sbatch downloaded: sbatch it beside plan.json"],
] as const;

function download(name: string, text: string | Blob): void {
  const url = URL.createObjectURL(typeof text === "string" ? new Blob([text], { type: "application/json" }) : text);
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  a.click();
  URL.revokeObjectURL(url);
}

/** Several nodes: each node's Accelerate YAML and torchrun line (the main node's address comes from the environment
 * or the command line; no file holds it). */
function PerNode({ yamls, lines }: { yamls: string[]; lines: string[] }) {
  return (
    <div data-testid="export-per-node">
      <div className="muted small">By hand: export MAIN_NODE_IP (node 0's address) on every node; accelerate launch takes it as --main_process_ip. The sbatch script reads it from Slurm.</div>
      {lines.map((line, i) => (
        <div key={i}>
          <h4>node {i}</h4>
          <pre className="export" data-testid={`export-node-${i}-launch`}>{line}</pre>
          <pre className="export" data-testid={`export-node-${i}-yaml`}>{yamls[i]}</pre>
        </div>
      ))}
    </div>
  );
}

/** The exports run what plan.json says: a plan with no run section gets one from these fields (steps, learning rate,
 * data), so the downloaded plan.json, sbatch script and torchrun lines train as downloaded. */
function ExportRunFields({ run, setRun }: { run: { steps: string; lr: string; data: string }; setRun: (r: { steps: string; lr: string; data: string }) => void }) {
  return (
    <div className="grid2" data-testid="export-run-fields">
      <div className="muted small">This plan has no run section: the exported plan.json gets these.</div>
      <label className="field"><span className="field-label">steps</span><input data-testid="export-steps" inputMode="numeric" value={run.steps} onChange={(e) => setRun({ ...run, steps: e.target.value })} /></label>
      <label className="field"><span className="field-label">learning rate</span><input data-testid="export-lr" value={run.lr} onChange={(e) => setRun({ ...run, lr: e.target.value })} /></label>
      <label className="field"><span className="field-label">data path (on the cluster)</span><input data-testid="export-data" value={run.data} onChange={(e) => setRun({ ...run, data: e.target.value })} /></label>
    </div>
  );
}

export function ExportButtons({ plan: formPlan, defaults }: { plan: Plan | null; defaults: Record<string, unknown> }) {
  const [shown, setShown] = useState<{ key: string; text: string } | null>(null);
  const [msg, setMsg] = useState("");
  const [perNode, setPerNode] = useState<{ yamls: string[]; lines: string[] } | null>(null);
  const [run, setRun] = useState({ steps: String(defaults.steps ?? ""), lr: String(defaults.learning_rate ?? ""), data: "examples/data/sample.txt" });
  const needsRun = !!formPlan && !formPlan.run;
  const plan: Plan | null = formPlan && needsRun
    ? { ...formPlan, run: { steps: Number(run.steps), learning_rate: Number(run.lr), data: { path: run.data } } as RunSection }
    : formPlan;
  const onCopy = async (key: (typeof EXPORTS)[number][0], label: string) => {
    if (!plan) return;
    try {
      const text = (await exportPlan(plan))[key] ?? "";
      await copyText(text);
      setShown({ key, text });
      setMsg(`${label} copied`);
    } catch (e) {
      setMsg(`export failed: ${(e as Error).message}`);
    }
  };
  return (
    <div className="card">
      <h3>Export</h3>
      <div className="buttons">
        <button type="button" data-testid="copy-link" disabled={!plan} onClick={async () => {
          if (!plan) return;
          const url = `${window.location.origin}${window.location.pathname}#/planner?plan=${encodePlanParam(plan)}`;
          await copyText(url);
          setShown({ key: "link", text: url });
          setMsg("link to this plan copied");
        }}>Copy link</button>
        {EXPORTS.map(([key, label]) => (
          <button key={key} type="button" data-testid={`copy-${key}`} disabled={!plan} onClick={() => onCopy(key, label)}>
            Copy {label}
          </button>
        ))}
        {DOWNLOADS.map(([key, file, label, said]) => (
          <button key={key} type="button" data-testid={`download-${key}`} disabled={!plan} onClick={async () => {
            if (!plan) return;
            try {
              download(file, (await exportPlan(plan))[key] ?? "");
              setMsg(said);
            } catch (e) {
              setMsg(`export failed: ${(e as Error).message}`);
            }
          }}>Download {label}</button>
        ))}
        <button type="button" data-testid="download-zip" disabled={!plan} onClick={async () => {
          if (!plan) return;
          try {
            download("ulysses-lab-plan.zip", await unwrap(client.POST("/api/estimate/export.zip", { body: plan, parseAs: "blob" })));
            setMsg("ulysses-lab-plan.zip downloaded: every file for every node (README.txt says what runs where)");
          } catch (e) {
            setMsg(`export failed: ${(e as Error).message}`);
          }
        }}>Download all (zip)</button>
        {plan && plan.hardware.num_nodes && plan.hardware.num_nodes > 1 ? (
          <button type="button" data-testid="show-per-node" onClick={async () => {
            const x = await exportPlan(plan);
            setPerNode({ yamls: x.accelerate_yaml_per_node ?? [], lines: x.launch_commands_per_node ?? [] });
          }}>Per-node files</button>
        ) : null}
      </div>
      {needsRun ? <ExportRunFields run={run} setRun={setRun} /> : null}
      {msg ? <div className="muted" data-testid="copy-status">{msg}</div> : null}
      {shown ? <pre className="export" data-testid="export-text">{shown.text}</pre> : null}
      {perNode ? <PerNode {...perNode} /> : null}
    </div>
  );
}

/** "Submit run": store the plan, create a run from it (pending approval), open the run page. The run section starts
 * from a loaded plan's (every field of it is kept) or from the plan model's defaults. */
/** Whole-number run fields the form offers besides steps: (key, label). Their defaults come from the plan model. */
const RUN_NUMBERS = [
  ["seed", "seed"],
  ["warmup_steps", "warmup steps"],
  ["checkpoint_every", "checkpoint every (steps, 0: never)"],
  ["keep_checkpoints", "checkpoints kept"],
  ["eval_rows", "rows held back for loss by position (0: none)"],
  ["eval_every", "loss by position every (steps, 0: at stage ends)"],
] as const;
type RunNumber = (typeof RUN_NUMBERS)[number][0];

/** A number field's value as the API should see it: the number, or what was typed when it is not one (so the API's
 * error says "abc" is not a number, instead of "got None"). */
function num(v: string): number {
  const t = v.trim();
  return (t !== "" && Number.isFinite(Number(t)) ? Number(t) : t) as number;
}

/** The fields the form shows an error beside (the rest go under the Submit button). */
const FIELD_KEYS = ["name", "run.steps", "run.learning_rate", "run.data.path", "run.data", "run.model_path", "run.lr_scheduler",
  "run.seed", "run.warmup_steps", "run.checkpoint_every", "run.keep_checkpoints", "run.eval_rows", "run.eval_every",
  "run.divergence_factor", "run.grad_norm_factor", "run.report_to", "run.throughput_floor", "run.stall_after_s", "priority", "max_retries"];

/** The alert rules that can stop a run (backend/metrics/alerts.py): (stop switch, its threshold or null, label). */
const GUARDRAILS = [
  ["stop_on_nan", null, "loss or grad norm is NaN/Inf"],
  ["stop_on_divergence", "divergence_factor", "loss above this many x the attempt's lowest (from its 3rd step)"],
  ["stop_on_grad_norm", "grad_norm_factor", "grad norm above this many x its median of the last 100 steps"],
  ["stop_on_throughput", "throughput_floor", "tokens/s below this fraction of the median, 5 steps in a row"],
  ["stop_on_stall", "stall_after_s", "no step for this many seconds"],
] as const;
type Guard = (typeof GUARDRAILS)[number];

export function SubmitRun({ plan, valid, initial, defaults, schedulers, trackers }: {
  plan: Plan | null; valid: boolean; initial?: RunSection | null; defaults: Record<string, unknown>; schedulers: string[];
  trackers: string[];
}) {
  const { identity } = useAuth();
  const allowed = can(identity, "submit");
  const [name, setName] = useState("");
  const [steps, setSteps] = useState(String(initial?.steps ?? defaults.steps));
  const [lr, setLr] = useState(String(initial?.learning_rate ?? defaults.learning_rate));
  const [data, setData] = useState(initial?.data?.path ?? "examples/data/sample.txt");
  // a loaded run section's values win over the defaults (so an example's checkpoint_every is kept)
  const [numbers, setNumbers] = useState<Record<RunNumber, string>>(
    () => Object.fromEntries(RUN_NUMBERS.map(([k]) => [k, String(initial?.[k] ?? defaults[k] ?? "")])) as Record<RunNumber, string>);
  const [scheduler, setScheduler] = useState(String(initial?.lr_scheduler ?? defaults.lr_scheduler));
  const [modelPath, setModelPath] = useState(initial?.model_path ?? "");
  const [stops, setStops] = useState<Record<string, boolean>>(
    () => Object.fromEntries(GUARDRAILS.map(([k]) => [k, Boolean(initial?.[k] ?? defaults[k])])));
  const [thresholds, setThresholds] = useState<Record<string, string>>(
    () => Object.fromEntries(GUARDRAILS.map((g) => g[1]).filter((t): t is NonNullable<Guard[1]> => t !== null)
      .map((t) => [t, String(initial?.[t] ?? defaults[t] ?? "")])));
  const [reportTo, setReportTo] = useState<string[]>(() => (initial?.report_to ?? []).map(String));
  const [priority, setPriority] = useState("0");
  const [retries, setRetries] = useState("0");
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState("");
  const [fieldErrors, setFieldErrors] = useState<Record<string, string>>({});
  /** The message of a refused submit beside its field (`run.learning_rate` under the learning rate). */
  const err = (k: string) => (fieldErrors[k] ? <div className="field-error" data-testid={`submit-error-${k}`}>{fieldErrors[k]}</div> : null);
  const submit = async () => {
    if (!plan) return;
    setBusy(true);
    setError("");
    setFieldErrors({});
    try {
      const planOnly = Object.fromEntries(Object.entries(plan).filter(([k]) => k !== "run")) as Plan;
      const run = await unwrapRun(client.POST("/api/runs", { body: {
        plan: planOnly, name: name || undefined, priority: num(priority), max_retries: num(retries),
        run: {
          ...(initial ?? {}), steps: num(steps), learning_rate: num(lr), data: { ...initial?.data, path: data },
          ...Object.fromEntries(RUN_NUMBERS.map(([k]) => [k, num(numbers[k])])),
          lr_scheduler: scheduler as RunSection["lr_scheduler"],
          ...stops, ...Object.fromEntries(Object.entries(thresholds).map(([k, v]) => [k, num(v)])),
          // empty: the API resolves the preset under the models root (ULAB_MODELS_DIR) or the hub cache
          model_path: modelPath.trim() || null,
          report_to: reportTo,
        } as RunSection,
      } }));
      navigate(`/runs/${run.id}`);
    } catch (e) {
      if (!(e instanceof ApiError)) return setError(String(e));
      const placed = new Set(e.fields.map((f) => f.field).filter((f) => FIELD_KEYS.includes(f)));
      setFieldErrors(Object.fromEntries(e.fields.filter((f) => placed.has(f.field)).map((f) => [f.field, f.message])));
      const rest = e.fields.filter((f) => !placed.has(f.field));
      setError(rest.length ? rest.map((f) => (f.field ? `${f.field}: ${f.message}` : f.message)).join("; ") : e.fields.length ? "" : e.message);
    } finally {
      setBusy(false);
    }
  };
  return (
    <div className="card">
      <h3>Submit run</h3>
      <div className="muted small">Stores this plan and creates a run waiting for approval; you are taken to its page.</div>
      <div className="grid2">
        <label className="field"><span className="field-label">name</span><input data-testid="run-name" value={name} onChange={(e) => setName(e.target.value)} placeholder="my-long-context-run" />{err("name")}</label>
        <label className="field"><span className="field-label">steps</span><input data-testid="run-steps" inputMode="numeric" value={steps} onChange={(e) => setSteps(e.target.value)} />{err("run.steps")}</label>
        <label className="field"><span className="field-label">learning rate</span><input data-testid="run-lr" value={lr} onChange={(e) => setLr(e.target.value)} />{err("run.learning_rate")}</label>
        <label className="field"><span className="field-label">priority (0–9)</span><input data-testid="run-priority" inputMode="numeric" value={priority} onChange={(e) => setPriority(e.target.value)} />{err("priority")}</label>
        <label className="field"><span className="field-label">automatic retries when lost</span><input data-testid="run-max-retries" inputMode="numeric" value={retries} onChange={(e) => setRetries(e.target.value)} />{err("max_retries")}</label>
        <label className="field"><span className="field-label">data path</span><input data-testid="run-data" value={data} onChange={(e) => setData(e.target.value)} />{err("run.data.path")}{err("run.data")}</label>
        <label className="field"><span className="field-label">model path (directory, name under the models root, or hub id)</span><input data-testid="run-model_path" value={modelPath} onChange={(e) => setModelPath(e.target.value)} placeholder="empty: the preset's checkpoint" />{err("run.model_path")}</label>
        <label className="field"><span className="field-label">LR schedule</span>
          <select data-testid="run-lr_scheduler" value={scheduler} onChange={(e) => setScheduler(e.target.value)}>
            {schedulers.map((v) => <option key={v}>{v}</option>)}
          </select>{err("run.lr_scheduler")}
        </label>
        {RUN_NUMBERS.map(([k, label]) => (
          <label key={k} className="field"><span className="field-label">{label}</span>
            <input data-testid={`run-${k}`} inputMode="numeric" value={numbers[k]} onChange={(e) => setNumbers({ ...numbers, [k]: e.target.value })} />
            {err(`run.${k}`)}
          </label>
        ))}
      </div>
      <fieldset className="guardrails" data-testid="run-report_to">
        <legend>Also report to (the worker mirrors every metric through the tracker's own client)</legend>
        {trackers.map((t) => (
          <label key={t} className="switch"><input type="checkbox" data-testid={`run-report_to-${t}`} checked={reportTo.includes(t)}
            onChange={(e) => setReportTo(e.target.checked ? [...reportTo, t] : reportTo.filter((x) => x !== t))} /> {t}</label>
        ))}
        {err("run.report_to")}
      </fieldset>
      <fieldset className="guardrails" data-testid="run-guardrails">
        <legend>Stop the run (with a checkpoint) when</legend>
        {GUARDRAILS.map(([stop, threshold, label]) => (
          <div key={stop} className="guardrail">
            <label><input type="checkbox" data-testid={`run-${stop}`} checked={stops[stop]} onChange={(e) => setStops({ ...stops, [stop]: e.target.checked })} /> {label}</label>
            {threshold ? (
              <input data-testid={`run-${threshold}`} aria-label={threshold} inputMode="decimal" value={thresholds[threshold]}
                onChange={(e) => setThresholds({ ...thresholds, [threshold]: e.target.value })} />
            ) : null}
            {threshold ? err(`run.${threshold}`) : null}
          </div>
        ))}
      </fieldset>
      <button type="button" className="primary" data-testid="submit-run" disabled={!plan || !valid || busy || !allowed} onClick={submit}>
        {busy ? "Submitting…" : "Submit run"}
      </button>
      {!allowed && identity !== undefined ? (
        <div className="muted small" data-testid="submit-not-allowed">
          {identity ? `Your role (${identity.role}) may not submit runs.` : <>Submitting needs a sign-in: <a href="#/signin?next=/planner">sign in</a>.</>}
        </div>
      ) : null}
      {error ? <div className="field-error" data-testid="submit-error">{error}</div> : null}
    </div>
  );
}
