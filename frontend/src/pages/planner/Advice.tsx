import { useMutation, useQuery } from "@tanstack/react-query";
import { useState } from "react";
import { client, unwrap, type Fix, type Plan, type Recommend, type Recommendation } from "../../lib/api";
import { fmtCount, fmtGiB, fmtGiBRange, fmtNum, fmtRange, fmtSeconds, fmtSeq } from "../../lib/format";
import { verdictBadge } from "../../lib/verdict";

type Training = NonNullable<Plan["training"]>;
const SAVERS: [keyof Training, string][] = [
  ["liger_kernel", "Liger"], ["tiled_logits_loss", "tiled loss"], ["activation_checkpointing", "checkpointing"],
  ["checkpoint_offload", "ckpt offload"], ["tiled_mlp", "tiled MLP"], ["offload_optimizer", "offload optimizer"],
  ["offload_params", "offload params"],
];

/** One line saying what a plan is: sp x dp, ZeRO, attention, micro batch and the savers it turns on. */
export function planSummary(p: Plan): string {
  const t = p.training;
  const on = SAVERS.filter(([k]) => t[k]).map(([, l]) => l);
  return `sp ${p.parallel?.sp_size} × dp ${p.parallel?.dp_size}, ZeRO-${t.zero_stage}, ${t.attn_implementation}` +
    `${(t.micro_batch_size ?? 1) > 1 ? `, micro batch ${t.micro_batch_size}` : ""}${on.length ? `, ${on.join(", ")}` : ""}`;
}

/** The fields Recommend searches over when the user lets it vary the layout and the memory savers. */
export const SEARCHED: (keyof Training)[] = ["zero_stage", "offload_optimizer", "offload_params", "activation_checkpointing",
  "checkpoint_offload", "tiled_mlp", "tiled_logits_loss", "liger_kernel", "attn_implementation", "micro_batch_size"];

/** What Recommend searches from: the model, the hardware, the length, and every training field the user set (one
 * that differs from the plan model's default), which the search keeps as it is. With `vary`, the layout (sp, dp)
 * and the fields in SEARCHED are left to the search; without it, they are kept too. */
export function searchFrom(plan: Plan, defaults: Record<string, Record<string, unknown>>, vary: boolean): Plan {
  const d = defaults.training ?? {};
  const training: Record<string, unknown> = { seq_len: plan.training.seq_len };
  for (const [k, v] of Object.entries(plan.training)) {
    if (k === "seq_len" || v === undefined || v === null) continue;
    if (vary && (SEARCHED as string[]).includes(k)) continue;
    if (JSON.stringify(v) !== JSON.stringify(d[k])) training[k] = v;
  }
  const out: Plan = { model: plan.model, hardware: plan.hardware, training: training as Training };
  if (!vary && plan.parallel) out.parallel = plan.parallel;
  return out;
}

/** The Recommend panel: the configurations that fit this model on these GPUs, ranked, each with "use this". */
export function RecommendPanel({ plan, globalBatch, defaults, onUse }: {
  plan: Plan | null; globalBatch: number | null; defaults: Record<string, Record<string, unknown>>; onUse: (p: Plan) => void;
}) {
  const [longest, setLongest] = useState(false);
  const [vary, setVary] = useState(true);
  const [varyBatch, setVaryBatch] = useState(false);
  const [answer, setAnswer] = useState<Recommend | null>(null);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState("");
  const run = async () => {
    if (!plan) return;
    setBusy(true);
    setError("");
    try {
      setAnswer(await unwrap(client.POST("/api/estimate/recommend", {
        body: { plan: searchFrom(plan, defaults, vary), longest, vary_global_batch: varyBatch, global_batch: varyBatch ? null : globalBatch },
      })));
    } catch (e) {
      setError((e as Error).message);
    }
    setBusy(false);
  };
  return (
    <div className="card" data-testid="recommend-panel">
      <div className="row-between">
        <h3>Recommend</h3>
        <span className="buttons">
          <label className="switch"><input type="checkbox" data-testid="recommend-longest" checked={longest}
            onChange={(e) => setLongest(e.target.checked)} />longest seq_len</label>
          <label className="switch" title="sp, dp, ZeRO stage, offload, checkpointing, tiling, Liger, attention and micro batch">
            <input type="checkbox" data-testid="recommend-vary" checked={vary}
              onChange={(e) => setVary(e.target.checked)} />vary layout and savers</label>
          <label className="switch" title="let the sequences per optimizer step follow dp (grad_accum stays yours)">
            <input type="checkbox" data-testid="recommend-vary-batch" checked={varyBatch}
              onChange={(e) => setVaryBatch(e.target.checked)} />vary global batch</label>
          <button type="button" data-testid="recommend-run" disabled={!plan || busy} onClick={run}>
            {busy ? "searching…" : "Recommend"}
          </button>
        </span>
      </div>
      <div className="muted">{vary ? "Searches sp, dp, ZeRO stage, offload, checkpointing, tiling, Liger, attention and micro batch"
        : "Keeps the layout and the savers you chose"} for this model and these GPUs at {plan ? fmtSeq(plan.training.seq_len) : "–"} tokens{longest ? " (or longer)" : ""};
        the other fields you set (dtype, …) stay as they are. {varyBatch ? "The global batch follows dp (grad accumulation stays yours)."
          : `Every option trains your global batch${globalBatch ? ` of ${fmtCount(globalBatch)} sequences` : ""} per step, grad accumulation adjusted.`}{" "}
        Options that fit at the high end of their range come before those that may not fit, and those needing a kernel the
        queue's workers lack come last.</div>
      {error ? <div className="field-error">{error}</div> : null}
      {answer ? (
        <div data-testid="recommendations">
          {answer.errors?.length ? <div className="field-error">{answer.errors.map((e) => `${e.field}: ${e.message}`).join("; ")}</div> : null}
          {!answer.recommendations.length && !answer.errors?.length ? <div className="field-error" data-testid="recommend-none">Nothing fits.</div> : null}
          <div className="muted small" data-testid="recommend-queue">{answer.queue_kernels
            ? `The queue's live workers have ${answer.queue_kernels.join(", ")}.`
            : "No GPU worker of this queue is up: the kernels each option needs are not checked."}</div>
          <ol className="recs">
            {answer.recommendations.map((r, i) => <RecCard key={i} rec={r} i={i} onUse={onUse} />)}
          </ol>
          {answer.rejected.length ? (
            <details data-testid="recommend-rejected">
              <summary>Nearest rejected ({answer.rejected.length})</summary>
              <ul>
                {answer.rejected.map((r, i) => (
                  <li key={i}><span className="mono">{planSummary(r.plan as Plan)}</span>: {r.why}</li>
                ))}
              </ul>
            </details>
          ) : null}
        </div>
      ) : null}
    </div>
  );
}

function RecCard({ rec, i, onUse }: { rec: Recommendation; i: number; onUse: (p: Plan) => void }) {
  const p = rec.plan as Plan;
  const m = rec.estimate.memory;
  const t = rec.estimate.throughput;
  const badge = m ? verdictBadge(m) : null;
  return (
    <li className={`rec ${rec.unavailable ? "unavailable" : ""}`} data-testid={`recommendation-${i}`} data-verdict={m?.verdict}
      data-missing={rec.missing_kernels.join(",")}>
      <div className="row-between">
        <b>{planSummary(p)}</b>
        <button type="button" data-testid={`use-recommendation-${i}`} onClick={() => onUse(p)}>use this</button>
      </div>
      <div className="kv">
        <span>seq_len <b>{fmtSeq(p.training.seq_len)}</b></span>
        <span>tokens/s <b data-testid={`rec-tps-${i}`}>{fmtNum(t?.tokens_per_s)}</b></span>
        {t ? <span data-testid={`rec-step-${i}`}>step <b>{fmtSeconds(t.step_time_s)}</b> ({fmtRange(t.step_time_s_range, fmtSeconds)})</span> : null}
        {t?.tokens_per_step ? <span data-testid={`rec-batch-${i}`} data-sequences={t.sequences_per_step} data-tokens={t.tokens_per_step}>
          <b>{fmtNum(t.tokens_per_step, 2)}</b> tokens ({fmtCount(t.sequences_per_step)} sequences) per step</span> : null}
        {t?.time_per_billion_tokens_s ? <span data-testid={`rec-per-billion-${i}`}>
          <b>{fmtSeconds(t.time_per_billion_tokens_s)}</b> per billion tokens ({fmtRange(t.time_per_billion_tokens_s_range, fmtSeconds)})</span> : null}
        <span data-testid={`rec-kernels-${i}`}>needs <b>{rec.kernels.join(", ")}</b></span>
        <span>per GPU <b>{fmtGiB(m?.device_total_gib)}</b> of {fmtGiB(m?.gpu_capacity_gib)}</span>
        {m && badge ? <span className={`badge ${badge.cls}`} data-testid={`rec-verdict-${i}`}>{m.verdict_text}</span> : null}
        {m ? <span data-testid={`rec-headroom-${i}`}>headroom <b>{fmtGiBRange(m.headroom_gib_range)}</b>
          {" "}({fmtRange(m.headroom_pct_range, (v) => v.toFixed(0))}%)</span> : null}
      </div>
      {rec.unavailable ? <div className="field-error" data-testid={`rec-unavailable-${i}`}>{rec.unavailable}</div> : null}
      <ul className="reasons">{rec.reasons.map((r, j) => <li key={j}>{r}</li>)}</ul>
    </li>
  );
}

/** The fewest, cheapest changes that make a plan fit; `load` applies them to the form. */
export function FixView({ fix, onApply, testid }: { fix: Fix; onApply?: (p: Plan) => void; testid: string }) {
  if (!fix.changes.length) {
    return <div className="muted" data-testid={`${testid}-none`}>{fix.cost}</div>;
  }
  return (
    <div data-testid={testid}>
      <table className="table">
        <thead><tr><th>field</th><th>from</th><th>to</th><th>time cost alone</th></tr></thead>
        <tbody>
          {fix.changes.map((c, i) => (
            <tr key={i} data-testid={`${testid}-change-${i}`}>
              <td className="mono">{c.field}</td><td>{String(c.from)}</td><td><b>{String(c.to)}</b></td>
              <td>{c.cost_pct == null ? "–" : `${c.cost_pct > 0 ? "+" : ""}${c.cost_pct}%`}</td>
            </tr>
          ))}
        </tbody>
      </table>
      <div data-testid={`${testid}-cost`}>{fix.cost}</div>
      {onApply && fix.plan ? (
        <button type="button" data-testid={`${testid}-apply`} onClick={() => onApply(fix.plan as Plan)}>apply these changes</button>
      ) : null}
    </div>
  );
}

/** Beside an estimate that does not fit: the minimal fix. */
export function FixPanel({ plan, planKey, onApply }: { plan: Plan; planKey: string; onApply: (p: Plan) => void }) {
  // keyed by the plan's text: the answer for an earlier plan is never shown for this one
  const { data: fix, error } = useQuery({
    queryKey: ["fix", planKey],
    queryFn: ({ signal }) => unwrap(client.POST("/api/estimate/fix", { body: plan, signal })),
  });
  return (
    <div className="card warn" data-testid="fix-panel">
      <h3>Make it fit</h3>
      {error ? <div className="field-error" data-testid="fix-error">{error.message}</div>
        : fix ? <FixView fix={fix} onApply={onApply} testid="fix" /> : <div className="muted">finding the smallest change…</div>}
    </div>
  );
}

/** Ulysses vs ring attention vs a hybrid for the current plan (an estimate). */
export function SpMethodsPanel({ plan }: { plan: Plan | null }) {
  const compare = useMutation({ mutationFn: (p: Plan) => unwrap(client.POST("/api/estimate/sp-methods", { body: p })) });
  const ans = compare.data;
  return (
    <div className="card" data-testid="sp-methods">
      <div className="row-between">
        <h3>Ulysses or ring attention?</h3>
        <button type="button" data-testid="sp-methods-run" disabled={!plan} onClick={() => plan && compare.mutate(plan)}>
          Compare
        </button>
      </div>
      {compare.error ? <div className="field-error" data-testid="sp-methods-error">{compare.error.message}</div> : null}
      {ans ? (
        <div>
          <div className="badge" data-testid="sp-methods-label">{ans.label}</div>
          <table className="table">
            <thead><tr><th>method</th><th>Ulysses × ring</th><th>per GPU</th><th>comm / step</th><th>step</th><th>tokens/s</th></tr></thead>
            <tbody>
              {ans.options.map((o) => (
                <tr key={o.method} className={o.method === ans.choice ? "chosen" : ""}>
                  <td>{o.method}</td><td>{o.ulysses_degree} × {o.ring_degree}</td>
                  {o.valid ? (
                    <>
                      <td>{fmtGiB(o.device_total_gib)}{o.device_total_gib_range ? ` (${fmtGiBRange(o.device_total_gib_range)})` : ""}{o.verdict_label && o.verdict_label !== "fits" ? ` ${o.verdict_label}` : ""}</td>
                      <td>{fmtNum(o.comm_gb_per_step)} GB</td><td>{fmtSeconds(o.step_time_s)}</td><td>{fmtNum(o.tokens_per_s)}</td>
                    </>
                  ) : <td colSpan={4} className="muted">{o.why_not}</td>}
                </tr>
              ))}
            </tbody>
          </table>
          <div>{ans.why}</div>
        </div>
      ) : null}
    </div>
  );
}
