import { describe, expect, it } from "vitest";
import { ema, fmtDuration, fmtGiB, fmtNum, fmtSeconds, fmtSeq, fmtTick, fmtValue, parseSeq, parseTime, parseTokens } from "./format";

describe("fmtNum", () => {
  it("scales to k, M and G with one decimal", () => {
    expect(fmtNum(1234)).toBe("1.2k");
    expect(fmtNum(2_500_000)).toBe("2.5M");
    expect(fmtNum(3.2e9, 2)).toBe("3.20G");
    expect(fmtNum(12.345)).toBe("12.3");
  });
  it("writes tiny values in scientific notation and missing ones as a dash", () => {
    expect(fmtNum(0.001)).toBe("1.00e-3");
    expect(fmtNum(0)).toBe("0.0");
    expect(fmtNum(null)).toBe("–");
    expect(fmtNum(undefined)).toBe("–");
    expect(fmtNum(NaN)).toBe("–");
  });
});

describe("fmtGiB", () => {
  it("uses the largest binary unit the value is at least 1 of", () => {
    expect(fmtGiB(80)).toBe("80.0 GiB");
    expect(fmtGiB(0.0026)).toBe("2.7 MiB");
    expect(fmtGiB(1 / 1024 / 1024 * 3)).toBe("3.0 KiB");
    expect(fmtGiB(0)).toBe("0.0 GiB");
    expect(fmtGiB(null)).toBe("–");
  });
});

describe("fmtValue", () => {
  it("keeps 4 significant digits, groups thousands and never abbreviates", () => {
    expect(fmtValue(7691.9)).toBe("7,692");
    expect(fmtValue(6.23456)).toBe("6.235");
    expect(fmtValue(0.0123)).toBe("0.0123");
    expect(fmtValue(0.00001234)).toBe("1.23e-5");
    expect(fmtValue(undefined)).toBe("–");
  });
});

describe("fmtSeconds", () => {
  it("picks a unit people read", () => {
    expect(fmtSeconds(0)).toBe("0 s");
    expect(fmtSeconds(0.00045)).toBe("450 µs");
    expect(fmtSeconds(0.00281)).toBe("2.81 ms");
    expect(fmtSeconds(1.25)).toBe("1.25 s");
    expect(fmtSeconds(200)).toBe("3 min 20 s");
    expect(fmtSeconds(7300)).toBe("2 h 2 min");
    expect(fmtSeconds(null)).toBe("–");
  });
});

describe("fmtTick", () => {
  it("keeps small ticks distinct", () => {
    expect(fmtTick(0, 1)).toBe("0");
    expect(fmtTick(1e-4, 1e-5)).toBe("1.0e-4");
    expect(fmtTick(0.25, 0.1)).toBe("0.25");
    expect(fmtTick(0.25, 0.05)).toBe("0.250");  // finer steps, one more digit
    expect(fmtTick(15000, 5000)).toBe("15.0k");
  });
});

describe("sequence lengths", () => {
  it("writes exact powers of two as K and M", () => {
    expect(fmtSeq(131072)).toBe("128K");
    expect(fmtSeq(1 << 20)).toBe("1M");
    expect(fmtSeq(1536 * 1024)).toBe("1536K");
    expect(fmtSeq((1 << 20) + 5000)).toBe("1.00M");
    expect(fmtSeq(1500)).toBe("1.5K");
    expect(fmtSeq(512)).toBe("512");
  });
  it("reads K and M back, and nothing else", () => {
    expect(parseSeq("128K")).toBe(131072);
    expect(parseSeq(" 1.5m ")).toBe(1572864);
    expect(parseSeq("65536")).toBe(65536);
    expect(parseSeq("12 tokens")).toBeNaN();
    expect(parseSeq("")).toBeNaN();
    for (const n of [512, 4096, 131072, 1 << 20]) expect(parseSeq(fmtSeq(n))).toBe(n);
  });
});

describe("parseTokens", () => {
  it("reads decimal budgets: K, M, B (or G), T and exponents", () => {
    expect(parseTokens("2B")).toBe(2e9);
    expect(parseTokens(" 500m ")).toBe(5e8);
    expect(parseTokens("1.5T")).toBe(1.5e12);
    expect(parseTokens("2e9")).toBe(2e9);
    expect(parseTokens("65536")).toBe(65536);
    expect(parseTokens("2 billion")).toBeNaN();
    expect(parseTokens("")).toBeNaN();
  });
});

describe("times", () => {
  it("reads a timestamp without a zone as UTC", () => {
    expect(parseTime("2026-01-01T00:00:00")).toBe(Date.UTC(2026, 0, 1));
    expect(parseTime("2026-01-01T02:00:00+02:00")).toBe(Date.UTC(2026, 0, 1));
    expect(parseTime("2026-01-01T00:00:00Z")).toBe(Date.UTC(2026, 0, 1));
  });
  it("writes a duration in s, m s and h m", () => {
    expect(fmtDuration("2026-01-01T00:00:00", "2026-01-01T00:00:42")).toBe("42s");
    expect(fmtDuration("2026-01-01T00:00:00", "2026-01-01T00:01:05")).toBe("1m 5s");
    expect(fmtDuration("2026-01-01T00:00:00", "2026-01-01T02:03:00")).toBe("2h 3m");
    expect(fmtDuration(null, null)).toBe("–");
    expect(fmtDuration("2026-01-01T00:01:00", "2026-01-01T00:00:00")).toBe("–");
  });
});

describe("ema", () => {
  it("is the raw series at weight 0", () => {
    const v = [1, null, 3];
    expect(ema(v, 0)).toBe(v);
  });
  it("is debiased and skips gaps", () => {
    const out = ema([1, null, 3, Infinity], 0.5);
    expect(out[0]).toBe(1);
    expect(out[1]).toBeNull();
    expect(out[2]).toBeCloseTo(1.75 / 0.75, 12);
    expect(out[3]).toBeNull();
  });
});
