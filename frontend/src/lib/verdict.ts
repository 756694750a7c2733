import type { Estimate } from "./api";

type Memory = NonNullable<Estimate["memory"]>;

/** The server's verdict (plan/verdict.py), as every page shows it: its badge words, its sentence and the badge's
 * colour. Nothing here words or decides a verdict. */
export function verdictBadge(m: Pick<Memory, "verdict" | "verdict_label">): { text: string; cls: string } {
  const cls = m.verdict_label === "fits" ? "ok" : m.verdict_label === "may not fit" ? "warn" : "bad";
  return { text: m.verdict_label, cls };
}
