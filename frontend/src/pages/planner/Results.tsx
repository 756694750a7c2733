import type { Estimate } from "../../lib/api";
import { fmtCount, fmtGiB, fmtGiBRange, fmtNum, fmtRange, fmtSeconds, parseTokens } from "../../lib/format";
import { verdictBadge } from "../../lib/verdict";

const COLORS: Record<string, string> = {
  params: "#2563eb",
  grads: "#7c3aed",
  optimizer: "#db2777",
  activations: "#ea580c",
  logits_and_loss: "#ca8a04",
  zero_buffers: "#16a34a",
  comm_buffers: "#0891b2",
  framework_overhead: "#64748b",
};
const color = (k: string, i: number) => COLORS[k] ?? ["#a3a3a3", "#84cc16", "#f43f5e"][i % 3];

/** Per-GPU memory: stacked breakdown (sums to peak allocated), the device total, against the GPU capacity. */
export function BreakdownBar({ est }: { est: Estimate }) {
  const m = est.memory;
  if (!m) return null;
  const entries = Object.entries(m.breakdown_gib).filter(([, v]) => v > 0);
  const scale = Math.max(m.gpu_capacity_gib, m.device_total_gib, m.peak_allocated_gib, m.device_total_gib_range[1]) * 1.02;
  const pct = (v: number) => `${(100 * v) / scale}%`;
  const extra = Math.max(0, m.device_total_gib - m.peak_allocated_gib);
  const badge = verdictBadge(m);
  const [lo, hi] = m.device_total_gib_range;
  return (
    <div className="card">
      <div className="row-between">
        <h3>Per-GPU memory</h3>
        <span className={`badge ${badge.cls}`} data-testid="est-fits" data-verdict={m.verdict}>{badge.text}</span>
      </div>
      <div className={`verdict ${badge.cls}`} data-testid="est-verdict" data-low={lo} data-high={hi}>
        {m.verdict_text} <span className="muted small">(device total {fmtGiBRange(m.device_total_gib_range)}:
          the range of published measurements in this regime)</span>
      </div>
      <div
        className="bar"
        data-testid="breakdown-bar"
        data-peak-gib={m.peak_allocated_gib}
        data-total-gib={m.device_total_gib}
        data-capacity-gib={m.gpu_capacity_gib}
        title={`peak allocated ${fmtGiB(m.peak_allocated_gib)}, device total ${fmtGiB(m.device_total_gib)}, capacity ${fmtGiB(m.gpu_capacity_gib)}`}
      >
        {entries.map(([k, v], i) => (
          <div key={k} className="bar-seg" data-testid={`breakdown-${k}`} data-gib={v}
            style={{ width: pct(v), background: color(k, i) }} title={`${k}: ${fmtGiB(v)}`} />
        ))}
        {extra > 0 ? <div className="bar-seg hatched" style={{ width: pct(extra) }} title={`allocator cache, CUDA context, NCCL: ${fmtGiB(extra)}`} /> : null}
        <div className="bar-band" data-testid="est-band" style={{ left: pct(Math.min(lo, scale)), width: pct(Math.max(0, Math.min(hi, scale) - Math.min(lo, scale))) }}
          title={`range of the device total: ${fmtGiB(lo)} to ${fmtGiB(hi)}`} />
        <div className="bar-cap" style={{ left: pct(m.gpu_capacity_gib) }} title={`capacity ${fmtGiB(m.gpu_capacity_gib)}`} />
      </div>
      <div className="bar-axis muted">
        <span>0</span>
        <span>capacity {fmtGiB(m.gpu_capacity_gib)}</span>
      </div>
      <ul className="legend">
        {entries.map(([k, v], i) => (
          <li key={k}><i style={{ background: color(k, i) }} />{k.replace(/_/g, " ")} <b>{fmtGiB(v)}</b></li>
        ))}
        {extra > 0 ? <li><i className="hatched" />cache, context, comm <b>{fmtGiB(extra)}</b></li> : null}
      </ul>
      <div className="figures">
        <Figure label="peak allocated" value={fmtGiB(m.peak_allocated_gib)} testid="est-peak" />
        <Figure label="device total (nvidia-smi)" value={fmtGiB(m.device_total_gib)} testid="est-device-total" />
        <Figure label="headroom" value={fmtGiBRange(m.headroom_gib_range)} testid="est-headroom" bad={m.verdict !== "fits"} />
        <Figure label="CPU memory / node" value={fmtGiB(m.cpu_gib_per_node)} testid="est-cpu-mem" bad={!m.cpu_fits} />
      </div>
    </div>
  );
}

function Figure({ label, value, testid, bad }: { label: string; value: string; testid: string; bad?: boolean }) {
  return (
    <div className={`figure ${bad ? "bad" : ""}`}>
      <div className="figure-value" data-testid={testid}>{value}</div>
      <div className="figure-label muted">{label}</div>
    </div>
  );
}

export function ThroughputFigures({ est }: { est: Estimate }) {
  const t = est.throughput;
  if (!t) return null;
  return (
    <div className="card">
      <h3>Throughput</h3>
      <div className="figures">
        <Figure label="tokens/s (job)" value={fmtNum(t.tokens_per_s)} testid="est-tokens-per-s" />
        <Figure label="tokens/s range" value={fmtRange(t.tokens_per_s_range, (v) => fmtNum(v))} testid="est-tokens-per-s-range" />
        <Figure label="tokens/s per GPU" value={fmtNum(t.tokens_per_s_per_gpu)} testid="est-tokens-per-s-per-gpu" />
        <Figure label="TFLOPS / GPU" value={fmtNum(t.tflops_per_gpu)} testid="est-tflops" />
        <Figure label="MFU" value={`${(100 * t.mfu).toFixed(1)}%`} testid="est-mfu" />
        <Figure label="step time" value={fmtSeconds(t.step_time_s)} testid="est-step-time" />
        <Figure label="step time range" value={fmtRange(t.step_time_s_range, fmtSeconds)} testid="est-step-time-range" />
        {t.tokens_per_step ? <Figure label={`tokens per step (${fmtCount(t.sequences_per_step)} sequences)`} value={fmtNum(t.tokens_per_step, 2)} testid="est-tokens-per-step" /> : null}
        {t.time_per_billion_tokens_s ? <Figure label={`per billion tokens (${fmtRange(t.time_per_billion_tokens_s_range, fmtSeconds)})`} value={fmtSeconds(t.time_per_billion_tokens_s)} testid="est-time-per-billion" /> : null}
      </div>
      {t.time_breakdown_s ? (
        <ul className="legend small">
          {Object.entries(t.time_breakdown_s).map(([k, v]) => (
            <li key={k}>{k.replace(/_/g, " ")} <b>{fmtSeconds(v)}</b></li>
          ))}
        </ul>
      ) : null}
    </div>
  );
}

/** What the run will cost: the token budget the user types, and the estimate's `cost` for it. */
export function CostCard({ est, budget, setBudget }: { est: Estimate | null; budget: string; setBudget: (s: string) => void }) {
  const c = est?.cost ?? null;
  const bad = budget.trim() !== "" && !Number.isFinite(parseTokens(budget));
  return (
    <div className="card" data-testid="cost-card">
      <h3>Run cost</h3>
      <label>
        Tokens to train{" "}
        <input data-testid="train-tokens" value={budget} placeholder="e.g. 2B" size={10}
          onChange={(e) => setBudget(e.target.value)} />
      </label>
      {bad ? <div className="field-error" data-testid="train-tokens-error">use a number, optionally with K, M, B or T (e.g. 2B)</div> : null}
      {c ? (
        <>
          <div className="verdict" data-testid="cost-summary" data-wall-s={c.wall_time_s} data-gpu-hours={c.gpu_hours}>
            {c.summary}
          </div>
          <div className="figures">
            <Figure label="steps" value={c.steps.toLocaleString("en-US")} testid="cost-steps" />
            <Figure label="wall time" value={fmtRange(c.wall_time_s_range, fmtSeconds)} testid="cost-wall-range" />
            <Figure label="GPU-hours" value={fmtRange(c.gpu_hours_range, fmtCount)} testid="cost-gpu-hours-range" />
            <Figure label="GPUs" value={String(c.gpus)} testid="cost-gpus" />
          </div>
          <div className="muted small">Training steps only: loading the model, checkpoint saves and evaluations come on top.</div>
        </>
      ) : <div className="muted small">Type a token budget to see the wall time and GPU-hours.</div>}
    </div>
  );
}

/** Warnings not already shown beside a form field (`placed` tells which are). */
export function Warnings({ est, placed }: { est: Estimate; placed: (field: string) => boolean }) {
  const rest = (est.warnings ?? []).filter((w) => typeof w === "string" || !placed(w.field));
  if (!rest.length) return null;
  return (
    <div className="card warn" data-testid="plan-warnings">
      {rest.map((w, i) => <div key={i}>⚠ {typeof w === "string" ? w : `${w.field}: ${w.message}`}</div>)}
    </div>
  );
}
