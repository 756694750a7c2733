import { useMemo } from "react";
import { Chart, PALETTE, type Line } from "../../components/Chart";
import type { Sweep } from "../../lib/api";
import { fmtCount, fmtNum, fmtSeq } from "../../lib/format";
import { INK } from "../../lib/theme";

/** Device memory vs seq_len for each sp_size, with the GPU capacity line, and the max context table. */
export function SweepView({ sweep, currentSp, onPick }: {
  sweep: Sweep; currentSp: number; onPick?: (sp: number, dp: number, seq: number) => void;
}) {
  const lines = useMemo<Line[]>(() => [
    ...sweep.series.filter((s) => s.valid !== false).map((s, i) => ({
      label: `sp=${s.sp_size}`,
      values: s.device_total_gib,
      color: PALETTE[i % PALETTE.length],
      width: s.sp_size === currentSp ? 3 : 1.5,
    })),
    { label: "capacity", values: sweep.seq_lens.map(() => sweep.gpu_capacity_gib ?? 0), color: INK, dash: [6, 4] },
  ], [sweep, currentSp]);
  const points = sweep.series.reduce((n, s) => n + s.device_total_gib.filter((v) => v !== null).length, 0);
  return (
    <>
      <Chart
        testid="sweep-chart"
        title="Per-GPU memory (device total, GiB) vs seq_len, clipped at 2× capacity"
        x={sweep.seq_lens}
        lines={lines}
        logX
        xLabel="seq_len"
        yLabel="device total"
        yUnit="GiB"
        xFormat={(v) => fmtSeq(Math.round(v))}
        points={points}
        height={260}
        yMax={(sweep.gpu_capacity_gib ?? 0) * 2}
      />
      <div className="card">
        <h3>Max context that fits on these GPUs <span className="muted small">(dp follows sp; click a row to use it)</span></h3>
        <table className="table" data-testid="max-context-table">
          <thead><tr><th>sp_size</th><th>dp_size</th><th>GPUs</th><th>max seq_len: safe / likely</th><th>tokens/s at 64K</th></tr></thead>
          <tbody>
            {sweep.series.map((s) => {
              const at = sweep.seq_lens.indexOf(65536);
              return (
                <tr key={s.sp_size} className={`${s.sp_size === currentSp ? "current" : ""} ${onPick && s.safe_max_seq_len ? "pickable" : ""}`}
                  data-testid={`max-context-sp-${s.sp_size}`} title="use this sp_size and the safe seq_len"
                  onClick={() => onPick && s.safe_max_seq_len && s.dp_size && onPick(s.sp_size, s.dp_size, s.safe_max_seq_len)}>
                  <td>{s.sp_size}</td>
                  <td>{s.dp_size ?? "–"}</td>
                  <td>{s.gpus ?? "–"}</td>
                  <td data-seq={s.max_seq_len ?? 0} data-safe-seq={s.safe_max_seq_len ?? 0}>
                    {s.valid === false ? <span className="muted">{s.errors?.map((e) => e.message).join("; ") ?? "invalid"}</span>
                      : s.max_seq_len ? `${s.safe_max_seq_len ? fmtSeq(s.safe_max_seq_len) : "none"} / ${fmtSeq(s.max_seq_len)} (${fmtCount(s.max_seq_len)})` : "does not fit"}
                  </td>
                  <td>{at >= 0 ? fmtNum(s.tokens_per_s[at]) : "–"}</td>
                </tr>
              );
            })}
          </tbody>
        </table>
      </div>
    </>
  );
}
