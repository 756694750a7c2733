import type { Estimate } from "./api";

type Memory = NonNullable<Estimate["memory"]>;

const dash = "\u2013";

/** The memory verdict and its range in words, as `ulab plan --text` says them (plan/report.py verdict_words):
 * "fits with 9–17 GiB to spare", "may not fit: 74–86 GiB of 80", "does not fit: 92–104 GiB of 80". */
export function verdictWords(m: Memory): string {
  const [lo, hi] = m.device_total_gib_range;
  const cap = m.gpu_capacity_gib;
  if (m.verdict === "fits") return `fits with ${(cap - hi).toFixed(0)}${dash}${(cap - lo).toFixed(0)} GiB to spare`;
  const word = m.verdict === "tight" ? "may not fit" : "does not fit";
  return `${word}: ${lo.toFixed(0)}${dash}${hi.toFixed(0)} GiB of ${cap.toFixed(0)}`;
}

/** The short badge: "fits", "may not fit", "does not fit". */
export function verdictBadge(m: Memory): { text: string; cls: string } {
  if (m.verdict === "fits") return { text: "fits", cls: "ok" };
  if (m.verdict === "tight") return { text: "may not fit", cls: "warn" };
  return { text: "does not fit", cls: "bad" };
}

/** "[low]–[high]" with a formatter. */
export function rangeText(r: number[] | null | undefined, fmt: (v: number) => string): string {
  if (!r || r.length !== 2) return "–";
  return `${fmt(r[0])}${dash}${fmt(r[1])}`;
}
