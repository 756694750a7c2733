import { useState } from "react";
import type { Plan, PlanDefaults } from "../../lib/api";
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
          load(JSON.parse(text));
        } catch (e) {
          setError(`not JSON: ${(e as Error).message}`);
        }
      }}>Load into the form</button>
      {error ? <div className="field-error" data-testid="load-plan-error">{error}</div> : null}
    </details>
  );
}
