import type { Store } from "./useRunData";

export type Aligned = { x: number[]; ranks: number[]; values: (number | null)[][]; count: number };

/** One metric's points, every rank aligned on the union of steps (null where a rank has no point). */
export function aligned(store: Store, name: string): Aligned {
  const byRank = store.get(name);
  if (!byRank) return { x: [], ranks: [], values: [], count: 0 };
  const ranks = [...byRank.keys()].sort((a, b) => a - b);
  const steps = new Set<number>();
  for (const r of ranks) for (const s of byRank.get(r)!.keys()) steps.add(s);
  const x = [...steps].sort((a, b) => a - b);
  const values = ranks.map((r) => {
    const m = byRank.get(r)!;
    return x.map((s) => (m.has(s) ? m.get(s)! : null));
  });
  return { x, ranks, values, count: x.length };
}

/** The first rank's series of a metric that only rank 0 writes (loss, lr, ...). */
export function single(store: Store, name: string): { x: number[]; y: (number | null)[] } {
  const a = aligned(store, name);
  if (!a.ranks.length) return { x: [], y: [] };
  return { x: a.x, y: a.values[0] };
}

/** Within 1e-3 of each other (relative): two ranks' values that one chart line would hide under the other. */
const close = (u: number | null, v: number | null) =>
  u !== null && v !== null && Math.abs(u - v) <= 1e-3 * Math.max(Math.abs(u), Math.abs(v));

/** Per-rank line labels of a per-rank chart: "rank R", or "rank R (= rank Q at k/n steps)" when the rank's line
 * lies on an earlier rank's at more than half of its points (SP ranks hold equal shards), so both stay visible. */
export function rankLabels(ranks: number[], values: (number | null)[][]): string[] {
  return ranks.map((r, i) => {
    const n = values[i].filter((v) => v !== null).length;
    let best = -1, bestCount = 0;
    for (let j = 0; j < i; j++) {
      const c = values[i].filter((v, k) => close(v, values[j][k])).length;
      if (c > bestCount) { best = j; bestCount = c; }
    }
    return best >= 0 && bestCount * 2 > n ? `rank ${r} (= rank ${ranks[best]} at ${bestCount}/${n} steps)` : `rank ${r}`;
  });
}
