import { useState } from "react";
import { ApiError, client, unwrap, type Plan, type PlanDefaults } from "../../lib/api";
import { planToForm, TINY_EXAMPLE, type Loaded } from "./form";

/** Start from an example or a pasted plan JSON (plan-v1, optionally with a `run` section); show the current one. */
export function LoadPlan({ plan, onLoad, defaults }: { plan: Plan | null; onLoad: (l: Loaded) => void; defaults: PlanDefaults }) {
  const [text, setText] = useState("");
  const [error, setError] = useState("");
  const load = (obj: unknown) => {
    try {
      onLoad(planToForm(obj, defaults));
      setError("");
    } catch (e) {
      setError((e as Error).message);
    }
  };
  /** A pasted plan is read as the API and the CLI read it: a misspelt key, an unknown preset or GPU is refused with
   * the API's error and its hint (never dropped, nor shown as another valid value); a plan that only breaks a rule
   * (sp_size vs heads, ...) loads, so the form can fix it. */
  const loadChecked = async (obj: unknown) => {
    try {
      await unwrap(client.POST("/api/plans/effective", { body: obj as Plan }));
    } catch (e) {
      if (!(e instanceof ApiError)) return setError(String(e));
      const unknown = e.fields.filter((f) => /^unknown /.test(f.message) || e.status !== 422);
      if (unknown.length > 0 || e.fields.length === 0) {
        return setError((unknown.length ? unknown : e.fields).map((f) => (f.field ? `${f.field}: ${f.message}` : f.message)).join("; ") || e.message);
      }
    }
    load(obj);
  };
  return (
    <details className="card load-plan" data-testid="load-plan">
      <summary>Examples and plan JSON</summary>
      <div className="buttons" style={{ margin: "8px 0" }}>
        <button type="button" data-testid="example-tiny" onClick={() => load(TINY_EXAMPLE)}>Tiny Llama, 2 CPU ranks (trains here)</button>
        <button type="button" data-testid="show-plan-json" disabled={!plan} onClick={() => setText(JSON.stringify(plan, null, 2))}>Show this plan as JSON</button>
      </div>
      <textarea rows={8} data-testid="plan-json" value={text} onChange={(e) => setText(e.target.value)} spellCheck={false}
        placeholder='{"model": {"preset": "Qwen/Qwen3-4B"}, "hardware": {...}, "parallel": {...}, "training": {...}}' />
      <button type="button" data-testid="load-plan-json" disabled={!text.trim()} onClick={() => {
        try {
          void loadChecked(JSON.parse(text));
        } catch (e) {
          setError(`not JSON: ${(e as Error).message}`);
        }
      }}>Load into the form</button>
      {error ? <div className="field-error" data-testid="load-plan-error">{error}</div> : null}
    </details>
  );
}
