import { useMemo } from "react";
import { Chart, PALETTE, type Line } from "../../components/Chart";
import { fmtNum, fmtSeq } from "../../lib/format";
import type { Store } from "./useRunData";

const MAX_CURVES = 16;

/** The run's long-context evaluations (worker/trainer/evaluate.py), stored as metric points at the step they ran:
 * `pos_loss@<hi>` (the held-back rows' loss in the position bucket ending at hi) and `passkey@<length>@<depth %>`. */
function evalSteps(store: Store, prefix: string): { names: string[]; steps: number[] } {
  const names = [...store.keys()].filter((n) => n.startsWith(prefix) && !n.includes("#"));
  const steps = new Set<number>();
  for (const n of names) for (const s of store.get(n)?.get(0)?.keys() ?? []) steps.add(s);
  return { names, steps: [...steps].sort((a, b) => a - b) };
}

function stageAt(store: Store, step: number): number | undefined {
  return store.get("stage")?.get(0)?.get(step);
}

/** Loss by position: one curve per evaluation, coloured by stage, so the stages of a progressive-extension run sit
 * on one chart; x is the position inside the document (log2 buckets). */
function PositionLoss({ store }: { store: Store }) {
  const data = useMemo(() => {
    const { names, steps } = evalSteps(store, "pos_loss@");
    const edges = names.map((n) => Number(n.split("@")[1])).sort((a, b) => a - b);
    const shown = steps.slice(-MAX_CURVES);
    const lines: Line[] = shown.map((step, i) => {
      const stage = stageAt(store, step);
      return {
        label: `step ${step}${stage !== undefined ? ` (stage ${stage})` : ""}`,
        values: edges.map((e) => store.get(`pos_loss@${e}`)?.get(0)?.get(step) ?? null),
        color: PALETTE[(stage ?? 0) % PALETTE.length],
        width: i === shown.length - 1 ? 2.5 : 1.2,
        dash: (stage ?? 0) % 2 ? [6, 3] : undefined,
      };
    });
    return { edges, lines, evaluations: steps.length, hidden: steps.length - shown.length };
  }, [store]);
  if (!data.evaluations) return null;
  return (
    <div data-testid="position-loss-wrap" data-evaluations={data.evaluations}>
      <Chart testid="position-loss-chart" x={data.edges} lines={data.lines} logX xLabel="position in the document"
        xFormat={(v) => fmtSeq(v)} height={240}
        title={`loss by token position on the held-back rows: ${data.evaluations} evaluation(s)${data.hidden ? `, the last ${MAX_CURVES} drawn` : ""}`} />
    </div>
  );
}

function cellColor(score: number): string {
  const hue = Math.round(120 * Math.max(0, Math.min(1, score)));  // red (0) to green (1)
  return `hsl(${hue}, 70%, 80%)`;
}

/** Passkey (needle in a haystack): one heatmap per evaluation, depth down, context length across. */
function Passkey({ store }: { store: Store }) {
  const maps = useMemo(() => {
    const { names, steps } = evalSteps(store, "passkey@");
    const cells = names.map((n) => { const [, len, depth] = n.split("@"); return { n, len: Number(len), depth: Number(depth) }; });
    const lengths = [...new Set(cells.map((c) => c.len))].sort((a, b) => a - b);
    const depths = [...new Set(cells.map((c) => c.depth))].sort((a, b) => a - b);
    return steps.map((step) => ({
      step, stage: stageAt(store, step), lengths, depths,
      score: (len: number, depth: number) => store.get(`passkey@${len}@${depth}`)?.get(0)?.get(step),
    }));
  }, [store]);
  if (!maps.length) return null;
  return (
    <div className="card" data-testid="passkey">
      <h3>Passkey retrieval <span className="muted small">(share of the key's tokens predicted; depth 0% = start of the context)</span></h3>
      <div className="heatmaps">
        {maps.map((m) => (
          <table key={m.step} className="heatmap" data-testid={`passkey-heatmap-${m.step}`}>
            <caption>after step {m.step}{m.stage !== undefined ? ` (stage ${m.stage})` : ""}</caption>
            <thead><tr><th>depth \ length</th>{m.lengths.map((l) => <th key={l}>{fmtSeq(l)}</th>)}</tr></thead>
            <tbody>
              {m.depths.map((d) => (
                <tr key={d}>
                  <th>{d}%</th>
                  {m.lengths.map((l) => {
                    const v = m.score(l, d);
                    return (
                      <td key={l} data-testid={`passkey-${m.step}-${l}-${d}`} data-score={v ?? ""}
                        style={{ background: v === undefined ? undefined : cellColor(v) }}>
                        {v === undefined ? "–" : fmtNum(v, 2)}
                      </td>
                    );
                  })}
                </tr>
              ))}
            </tbody>
          </table>
        ))}
      </div>
    </div>
  );
}

/** Shown when the run evaluates (run.eval_rows, passkey stages); nothing otherwise. */
export function EvalCharts({ store }: { store: Store }) {
  return (
    <div data-testid="eval-charts">
      <PositionLoss store={store} />
      <Passkey store={store} />
    </div>
  );
}
