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
