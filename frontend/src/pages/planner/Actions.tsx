import { useState } from "react";
import { api, ApiError, type Plan } from "../../lib/api";
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
  ["launch_command", "launch command"],
] as const;

export function ExportButtons({ plan }: { plan: Plan | null }) {
  const [shown, setShown] = useState<{ key: string; text: string } | null>(null);
  const [msg, setMsg] = useState("");
  const onCopy = async (key: (typeof EXPORTS)[number][0], label: string) => {
    if (!plan) return;
    try {
      const out = await api.exportPlan(plan);
      await copyText(out[key]);
      setShown({ key, text: out[key] });
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
      </div>
      {msg ? <div className="muted" data-testid="copy-status">{msg}</div> : null}
      {shown ? <pre className="export" data-testid="export-text">{shown.text}</pre> : null}
    </div>
  );
}

/** "Submit run": store the plan, create a run from it (pending approval), open the run page. */
type RunInit = { steps?: number; learning_rate?: number; data?: { path?: string } } | null;

export function SubmitRun({ plan, valid, initial }: { plan: Plan | null; valid: boolean; initial?: RunInit }) {
  const { identity } = useAuth();
  const allowed = can(identity, "submit");
  const [name, setName] = useState("");
  const [steps, setSteps] = useState(String(initial?.steps ?? 20));
  const [lr, setLr] = useState(String(initial?.learning_rate ?? "1e-3"));
  const [data, setData] = useState(initial?.data?.path ?? "examples/data/sample.txt");
  const [priority, setPriority] = useState("0");
  const [retries, setRetries] = useState("0");
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState("");
  const submit = async () => {
    if (!plan) return;
    setBusy(true);
    setError("");
    try {
      const stored = await api.createPlan(plan, name || undefined);
      const run = await api.createRun(
        stored.id,
        { steps: Number(steps), learning_rate: Number(lr), seed: 0, data: { path: data } },
        name || undefined,
        { priority: Number(priority), max_retries: Number(retries) },
      );
      navigate(`/runs/${run.id}`);
    } catch (e) {
      setError(e instanceof ApiError ? e.message : String(e));
    } finally {
      setBusy(false);
    }
  };
  return (
    <div className="card">
      <h3>Submit run</h3>
      <div className="muted small">Stores this plan and creates a run waiting for approval; you are taken to its page.</div>
      <div className="grid2">
        <label className="field"><span className="field-label">name</span><input data-testid="run-name" value={name} onChange={(e) => setName(e.target.value)} placeholder="my-long-context-run" /></label>
        <label className="field"><span className="field-label">steps</span><input data-testid="run-steps" inputMode="numeric" value={steps} onChange={(e) => setSteps(e.target.value)} /></label>
        <label className="field"><span className="field-label">learning rate</span><input data-testid="run-lr" value={lr} onChange={(e) => setLr(e.target.value)} /></label>
        <label className="field"><span className="field-label">priority (0–9)</span><input data-testid="run-priority" inputMode="numeric" value={priority} onChange={(e) => setPriority(e.target.value)} /></label>
        <label className="field"><span className="field-label">automatic retries when lost</span><input data-testid="run-max-retries" inputMode="numeric" value={retries} onChange={(e) => setRetries(e.target.value)} /></label>
        <label className="field"><span className="field-label">data path</span><input data-testid="run-data" value={data} onChange={(e) => setData(e.target.value)} /></label>
      </div>
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
