// One formatter for every page and chart axis: numbers never print in scientific notation where a reader expects
// a plain one ("480 MiB", not "4.8e+2 MiB"; "0.0052", not "5.20e-3"), ranges keep one unit ("871 s–30 min 20 s"
// becomes "14 min 31 s – 30 min 20 s"), and a negative headroom reads "short by 3.5–105.5 GiB".

const DASH = "–";

/** `v` at `n` significant digits, thousands grouped, never in exponent form above 1e-9: "480", "0.0052", "12,300". */
export function sig(v: number, n = 3): string {
  if (v === 0 || !Number.isFinite(v)) return String(v);
  const r = Number(v.toPrecision(n));
  const decimals = Math.max(0, n - 1 - Math.floor(Math.log10(Math.abs(r))));
  if (Math.abs(r) < 1e-9) return r.toExponential(n - 1);
  return r.toLocaleString("en-US", { maximumFractionDigits: Math.min(decimals, 20) });
}

/** A count or rate in k/M/G with `digits` decimals ("97.9k", "2.5M"); a value those decimals would write as 0
 * ("0.0", "0.00") at 3 significant digits ("0.0217"). */
export function fmtNum(v: number | null | undefined, digits = 1): string {
  if (v === null || v === undefined || Number.isNaN(v)) return DASH;
  const a = Math.abs(v);
  if (a >= 1e9) return (v / 1e9).toFixed(digits) + "G";
  if (a >= 1e6) return (v / 1e6).toFixed(digits) + "M";
  if (a >= 1e3) return (v / 1e3).toFixed(digits) + "k";
  if (a !== 0 && a < 10 ** -digits) return sig(v, 3);
  return v.toFixed(digits);
}

/** A whole count with its thousands grouped: "262,144". */
export function fmtCount(v: number | null | undefined): string {
  if (v === null || v === undefined || Number.isNaN(v)) return DASH;
  return Math.round(v).toLocaleString("en-US");
}

const UNITS: [number, string][] = [[1024, "TiB"], [1, "GiB"], [1 / 1024, "MiB"], [1 / 1024 / 1024, "KiB"]];

/** The binary unit a magnitude in GiB reads best in: the largest it is at least 1 of. */
function unitFor(gib: number): [number, string] {
  const a = Math.abs(gib);
  return UNITS.find(([div]) => a >= div) ?? UNITS[UNITS.length - 1];
}

/** A GiB value in that unit: one decimal below 1,000 of it, whole (grouped) above. */
function inUnit(gib: number, div: number, scale: number): string {
  const x = gib / div;
  return Math.abs(scale / div) >= 1000 ? Math.round(x).toLocaleString("en-US") : x.toFixed(1);
}

/** Memory given in GiB, in the largest binary unit under which it is at least 1: "2.7 MiB", "480.0 MiB", "4,033 GiB". */
export function fmtGiB(v: number | null | undefined): string {
  if (v === null || v === undefined || Number.isNaN(v)) return DASH;
  if (v === 0) return "0.0 GiB";
  const [div, unit] = unitFor(v);
  return `${inUnit(v, div, v)} ${unit}`;
}

/** A range of memory in GiB in one unit: "44.0–97.0 GiB", "2.1–4.5 MiB"; "short by 3.5–105.5 GiB" when both ends are
 * negative (a headroom), "short by up to 3.5 GiB, up to 10.0 GiB to spare" when it spans 0. */
export function fmtGiBRange(r: readonly number[] | null | undefined): string {
  if (!r || r.length !== 2) return DASH;
  const [lo, hi] = r[0] <= r[1] ? [r[0], r[1]] : [r[1], r[0]];
  const scale = Math.max(Math.abs(lo), Math.abs(hi));
  const [div, unit] = unitFor(scale || 1);
  const f = (x: number) => inUnit(x, div, scale);
  if (hi < 0) return `short by ${f(-hi)}${DASH}${f(-lo)} ${unit}`;
  if (lo < 0) return `short by up to ${f(-lo)} ${unit}, up to ${f(hi)} ${unit} to spare`;
  return lo === hi ? `${f(lo)} ${unit}` : `${f(lo)}${DASH}${f(hi)} ${unit}`;
}

/** "[low]–[high]" with a formatter: one unit written once ("9.46–19.8 s"), spaced when the parts have several
 * ("14 min 31 s – 30 min 20 s"), "to" across a sign ("-3 to 4"). */
export function fmtRange(r: readonly number[] | null | undefined, fmt: (v: number) => string): string {
  if (!r || r.length !== 2) return DASH;
  const [a, b] = [fmt(r[0]), fmt(r[1])];
  if (a === b) return a;
  if (r[0] < 0 || r[1] < 0) return `${a} to ${b}`;
  const unit = /^([\d.,]+[kMG%]?) (\S+)$/;
  const [ua, ub] = [a.match(unit), b.match(unit)];
  if (ua && ub && ua[2] === ub[2]) return `${ua[1]}${DASH}${ub[1]} ${ua[2]}`;
  return a.includes(" ") || b.includes(" ") ? `${a} ${DASH} ${b}` : `${a}${DASH}${b}`;
}

/** A measured value (a loss, a grad norm) at 4 significant digits, with thousands grouped: "7,692", "6.234",
 * "0.0123", "0.00001234". Never "7.6919k". */
export function fmtValue(v: number | null | undefined): string {
  if (v === null || v === undefined || Number.isNaN(v)) return DASH;
  if (Math.abs(v) >= 1000) return Math.round(v).toLocaleString("en-US");
  return sig(v, 4);
}

/** A duration in seconds in a unit people read: "2.81 ms", "450 µs", "1.25 s", "3 min 20 s". */
export function fmtSeconds(v: number | null | undefined): string {
  if (v === null || v === undefined || Number.isNaN(v)) return DASH;
  const a = Math.abs(v);
  if (a === 0) return "0 s";
  if (a < 1e-3) return `${sig(v * 1e6, 3)} µs`;
  if (a < 1) return `${sig(v * 1e3, 3)} ms`;
  if (a < 120) return `${sig(v, 3)} s`;
  const s = Math.round(v);
  if (a < 7200) return `${Math.floor(s / 60)} min ${s % 60} s`;
  const m = Math.round(v / 60);
  if (a < 172800) return `${Math.floor(m / 60)} h ${m % 60} min`;
  const h = Math.round(v / 3600);  // whole hours first: the remainder of a rounded count never reads "24 h"
  return `${Math.floor(h / 24)} d ${h % 24} h`;
}

/** Axis tick labels: short, distinct at the axis's step `span`, never in exponent form ("0.0052", "1e-5" is
 * "0.00001"), and large values in k/M/G. */
export function fmtTick(v: number, span: number): string {
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a >= 1e4) return fmtNum(v, a >= 1e6 ? 2 : 1);
  return v.toFixed(decimals(span > 0 ? span : a));
}

/** The decimals that write `step` (at 3 significant digits) exactly: 0.25 -> 2, 0.1 -> 1, 5 -> 0, 1e-5 -> 5. */
function decimals(step: number): number {
  const m = Number(step.toPrecision(3));
  for (let d = 0; d < 15; d++) if (Math.abs(Math.round(m * 10 ** d) - m * 10 ** d) < 1e-6) return d;
  return 15;
}

/** Axis ticks of a memory axis in GiB: in the unit of the axis's largest tick ("512 MiB", not "0.5"). */
export function fmtGiBTick(v: number, max: number): string {
  if (v === 0) return "0";
  const [div, unit] = unitFor(max || v);
  return `${sig(v / div, 3)} ${unit}`;
}

// Sequence lengths: 131072 -> "128K", 1048576 -> "1M"
export function fmtSeq(n: number): string {
  if (n >= 1 << 20 && n % (1 << 20) === 0) return `${n / (1 << 20)}M`;
  if (n >= 1024 && n % 1024 === 0) return `${n / 1024}K`;
  if (n >= 1 << 20) return `${(n / (1 << 20)).toFixed(2)}M`;
  if (n >= 1024) return `${(n / 1024).toFixed(1)}K`;
  return String(n);
}

/** A whole number as people type it: "262,144", "262 144", "262_144" and "262144" are 262144; NaN otherwise. */
export function parseWhole(s: string): number {
  const t = s.trim().replace(/(\d)[,_\s](?=\d{3}\b)/g, "$1");
  return /^\d+$/.test(t) ? Number(t) : NaN;
}

// "128K" -> 131072, "1M" -> 1048576, "1.5M" -> 1572864, "65536" and "65,536" -> 65536; NaN when unreadable
export function parseSeq(s: string): number {
  const m = s.trim().match(/^(\d[\d,_\s]*(?:\.\d+)?)\s*([kKmM]?)$/);
  if (!m) return NaN;
  const mult = m[2].toLowerCase() === "k" ? 1024 : m[2].toLowerCase() === "m" ? 1 << 20 : 1;
  const [whole, frac] = m[1].trim().split(".");
  const n = parseWhole(whole);
  if (!Number.isFinite(n)) return NaN;
  return Math.round((frac === undefined ? n : n + Number(`0.${frac}`)) * mult);
}

// Token budgets, decimal: "2B" -> 2e9, "500M" -> 5e8, "1.5T" -> 1.5e12, "2e9" -> 2e9; NaN when unreadable
export function parseTokens(s: string): number {
  const m = s.trim().match(/^(\d+(?:\.\d+)?(?:e\d+)?)\s*([kKmMbBgGtT]?)$/);
  if (!m) return NaN;
  const mult = { "": 1, k: 1e3, m: 1e6, b: 1e9, g: 1e9, t: 1e12 }[m[2].toLowerCase()] ?? 1;
  return Math.round(parseFloat(m[1]) * mult);
}

/** API timestamps without a zone are UTC. */
export function parseTime(iso: string): number {
  return Date.parse(/[zZ]|[+-]\d\d:?\d\d$/.test(iso) ? iso : `${iso}Z`);
}

export function fmtTime(iso: string | null | undefined): string {
  if (!iso) return "–";
  const d = new Date(parseTime(iso));
  return d.toLocaleString(undefined, { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

export function fmtDuration(startIso: string | null, endIso: string | null): string {
  if (!startIso) return DASH;
  const ms = (endIso ? parseTime(endIso) : Date.now()) - parseTime(startIso);
  if (!(ms >= 0)) return DASH;
  return fmtSeconds(Math.round(ms / 1000));
}

// Exponential moving average as in TensorBoard/W&B: weight 0 = raw, 0.99 = very smooth (debiased).
export function ema(values: (number | null)[], weight: number): (number | null)[] {
  if (weight <= 0) return values;
  let last = 0;
  let n = 0;
  return values.map((v) => {
    if (v === null || !Number.isFinite(v)) return null;
    last = last * weight + (1 - weight) * v;
    n += 1;
    return last / (1 - Math.pow(weight, n));
  });
}
