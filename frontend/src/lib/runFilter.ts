import { parseSeq } from "./format";

/** A filter on runs by any plan field or final metric, as a user types it, clauses joined by commas (all must hold):
 *   training.seq_len>=64K, run.learning_rate<1e-3, final_loss<4.5, parallel.sp_size=4, model.preset~llama
 * A path under model, hardware, parallel, training or run reads the run's plan (its spec); any other reads the run
 * (final_loss, state, name, tags, device, estimate.memory.verdict, ...) or `extra` (the measured tokens_per_s).
 * Numbers compare as numbers ("64K" and "65,536" are 65536); other values compare as text, case aside; `~` is
 * "contains"; a list (tags) holds a clause when one of its items does. */
export type Op = "<=" | ">=" | "!=" | "=" | "<" | ">" | "~";
export type Clause = { path: string; op: Op; value: string };

const PLAN_SECTIONS = ["model", "hardware", "parallel", "training", "run"];
const CLAUSE = /^\s*([A-Za-z_][\w.]*)\s*(<=|>=|!=|=|<|>|~)\s*(.+?)\s*$/;

/** The clauses of `text`, or the first one that does not read ("expected field<op>value"). */
export function parseFilter(text: string): { clauses: Clause[]; error: string | null } {
  const clauses: Clause[] = [];
  // a comma before a field name ends a clause; one inside a number ("65,536") does not
  for (const part of text.split(/,(?=\s*[A-Za-z_])/).map((p) => p.trim()).filter(Boolean)) {
    const m = CLAUSE.exec(part);
    if (!m) return { clauses: [], error: `"${part}": write field, an operator (= != < <= > >= ~) and a value` };
    clauses.push({ path: m[1], op: m[2] as Op, value: m[3] });
  }
  return { clauses, error: null };
}

type Row = { spec?: unknown };

function at(obj: unknown, path: string[]): unknown {
  let v = obj;
  for (const key of path) {
    if (v === null || typeof v !== "object") return undefined;
    v = (v as Record<string, unknown>)[key];
  }
  return v;
}

/** The value a clause's path names for a run. */
export function runValue(run: Row, path: string, extra: Record<string, unknown> = {}): unknown {
  const keys = path.split(".");
  if (PLAN_SECTIONS.includes(keys[0])) return at(run.spec, keys);
  return path in extra ? extra[path] : at(run, keys);
}

function asNumber(v: unknown): number {
  if (typeof v === "number") return v;
  if (typeof v !== "string" || !v.trim()) return NaN;
  const n = Number(v.trim());
  return Number.isFinite(n) ? n : parseSeq(v);
}

function holds(v: unknown, op: Op, want: string): boolean {
  if (Array.isArray(v)) return op === "!=" ? v.every((x) => holds(x, op, want)) : v.some((x) => holds(x, op, want));
  if (v === undefined || v === null) return op === "!=";
  const [a, b] = [asNumber(v), asNumber(want)];
  if (op !== "~" && Number.isFinite(a) && Number.isFinite(b)) {
    return { "=": a === b, "!=": a !== b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b }[op];
  }
  const [s, t] = [String(v).toLowerCase(), want.toLowerCase()];
  if (op === "~") return s.includes(t);
  if (op === "=") return s === t;
  if (op === "!=") return s !== t;
  return { "<": s < t, "<=": s <= t, ">": s > t, ">=": s >= t }[op];
}

/** Whether a run holds every clause. */
export function matches(run: Row, clauses: Clause[], extra: Record<string, unknown> = {}): boolean {
  return clauses.every((c) => holds(runValue(run, c.path, extra), c.op, c.value));
}
