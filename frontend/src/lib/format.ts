export function fmtNum(v: number | null | undefined, digits = 1): string {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  const a = Math.abs(v);
  if (a >= 1e9) return (v / 1e9).toFixed(digits) + "G";
  if (a >= 1e6) return (v / 1e6).toFixed(digits) + "M";
  if (a >= 1e3) return (v / 1e3).toFixed(digits) + "k";
  if (a !== 0 && a < 0.01) return v.toExponential(2);
  return v.toFixed(digits);
}

/** Memory in the largest binary unit under which it is at least 1: 2.7 MiB, not "0.0027 GiB". */
export function fmtGiB(v: number | null | undefined): string {
  if (v === null || v === undefined) return "–";
  const a = Math.abs(v);
  if (a === 0 || a >= 1) return `${v.toFixed(1)} GiB`;
  if (a >= 1 / 1024) return `${(v * 1024).toPrecision(2)} MiB`;
  return `${(v * 1024 * 1024).toPrecision(2)} KiB`;
}

/** A measured value (a loss, a grad norm) at 4 significant digits, with thousands grouped: "7,692", "6.234",
 * "0.0123", and scientific only below 1e-4. Never "7.6919k". */
export function fmtValue(v: number | null | undefined): string {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  const a = Math.abs(v);
  if (a >= 1000) return Math.round(v).toLocaleString("en-US");
  if (a !== 0 && a < 1e-4) return v.toExponential(2);
  return String(Number(v.toPrecision(4)));
}

/** A duration in seconds in a unit people read: "2.81 ms", "450 µs", "1.25 s", "3 min 20 s". */
export function fmtSeconds(v: number | null | undefined): string {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  const a = Math.abs(v);
  if (a === 0) return "0 s";
  if (a < 1e-3) return `${Number((v * 1e6).toPrecision(3))} µs`;
  if (a < 1) return `${Number((v * 1e3).toPrecision(3))} ms`;
  if (a < 120) return `${Number(v.toPrecision(3))} s`;
  if (a < 7200) return `${Math.floor(v / 60)} min ${Math.round(v % 60)} s`;
  return `${Math.floor(v / 3600)} h ${Math.round((v % 3600) / 60)} min`;
}

/** Axis tick labels: short, and still distinct for small values (lr ~ 1e-4). */
export function fmtTick(v: number, span: number): string {
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a >= 1e4) return fmtNum(v, a >= 1e6 ? 2 : 1);
  if (a < 1e-2) return v.toExponential(span / a < 0.1 ? 2 : 1);
  const digits = Math.max(0, Math.min(6, Math.ceil(-Math.log10(span || a)) + 1));
  return v.toFixed(digits);
}

// Sequence lengths: 131072 -> "128K", 1048576 -> "1M"
export function fmtSeq(n: number): string {
  if (n >= 1 << 20 && n % (1 << 20) === 0) return `${n / (1 << 20)}M`;
  if (n >= 1024 && n % 1024 === 0) return `${n / 1024}K`;
  if (n >= 1 << 20) return `${(n / (1 << 20)).toFixed(2)}M`;
  if (n >= 1024) return `${(n / 1024).toFixed(1)}K`;
  return String(n);
}

// "128K" -> 131072, "1M" -> 1048576, "1.5M" -> 1572864, "65536" -> 65536; NaN when unreadable
export function parseSeq(s: string): number {
  const m = s.trim().match(/^(\d+(?:\.\d+)?)\s*([kKmM]?)$/);
  if (!m) return NaN;
  const mult = m[2].toLowerCase() === "k" ? 1024 : m[2].toLowerCase() === "m" ? 1 << 20 : 1;
  return Math.round(parseFloat(m[1]) * mult);
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
  if (!startIso) return "–";
  const ms = (endIso ? parseTime(endIso) : Date.now()) - parseTime(startIso);
  if (!(ms >= 0)) return "–";
  const s = Math.round(ms / 1000);
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
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
