import { describe, expect, it } from "vitest";
import {
  ema, fmtCount, fmtDuration, fmtGiB, fmtGiBRange, fmtGiBTick, fmtNum, fmtRange, fmtSeconds, fmtSeq, fmtTick, fmtValue,
  parseSeq, parseTime, parseTokens, parseWhole, sig,
} from "./format";

describe("fmtNum", () => {
  it("scales to k, M and G with one decimal", () => {
    expect(fmtNum(1234)).toBe("1.2k");
    expect(fmtNum(2_500_000)).toBe("2.5M");
    expect(fmtNum(3.2e9, 2)).toBe("3.20G");
    expect(fmtNum(12.345)).toBe("12.3");
  });
  it("writes tiny values as plain decimals and missing ones as a dash", () => {
    expect(fmtNum(0.001)).toBe("0.001");
    expect(fmtNum(0.00523)).toBe("0.00523");
    expect(fmtNum(0)).toBe("0.0");
    expect(fmtNum(0.04)).toBe("0.04");            // not "0.0" at one decimal
    expect(fmtNum(0.0044, 2)).toBe("0.0044");     // not "0.00" at two
    expect(fmtNum(0.5, 2)).toBe("0.50");
    expect(fmtNum(null)).toBe("–");
    expect(fmtNum(undefined)).toBe("–");
    expect(fmtNum(NaN)).toBe("–");
  });
});

describe("fmtGiB", () => {
  it("uses the largest binary unit the value is at least 1 of", () => {
    expect(fmtGiB(80)).toBe("80.0 GiB");
    expect(fmtGiB(0.0026)).toBe("2.7 MiB");
    expect(fmtGiB(480 / 1024)).toBe("480.0 MiB");            // never "4.8e+2 MiB"
    expect(fmtGiB(4033.1)).toBe("3.9 TiB");
    expect(fmtGiB(-3.5)).toBe("-3.5 GiB");
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
    expect(fmtValue(0.00001234)).toBe("0.00001234");
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
    expect(fmtSeconds(986)).toBe("16 min 26 s");
    expect(fmtSeconds(3 * 86400 + 7200)).toBe("3 d 2 h");
    expect(fmtSeconds(4 * 86400 - 600)).toBe("4 d 0 h");   // never "3 d 24 h"
    expect(fmtSeconds(3 * 3600 - 20)).toBe("3 h 0 min");   // never "2 h 60 min"
    expect(fmtSeconds(null)).toBe("–");
  });
});

describe("fmtTick", () => {
  it("keeps small ticks distinct", () => {
    expect(fmtTick(0, 1)).toBe("0");
    expect(fmtTick(1e-4, 1e-5)).toBe("0.00010");
    expect(fmtTick(0.25, 0.25)).toBe("0.25");
    expect(fmtTick(0.2, 0.05)).toBe("0.20");    // every tick of an axis at the digits of its step
    expect(fmtTick(3, 1)).toBe("3");
    expect(fmtTick(15000, 5000)).toBe("15.0k");
  });
  it("never writes an exponent on an axis", () => {
    for (const [v, span] of [[0.0052, 0.001], [5.2e-3, 5.2e-3], [3e-5, 1e-5], [0.0125, 0.0025]]) {
      expect(fmtTick(v, span)).not.toMatch(/e[+-]/);
    }
    expect(fmtTick(0.0052, 0.0002)).toBe("0.0052");
  });
  it("writes a memory axis in the unit of its largest tick", () => {
    expect(fmtGiBTick(0.0052, 0.008)).toBe("5.32 MiB");     // never "5.20e-3" GiB
    expect(fmtGiBTick(40, 80)).toBe("40 GiB");
    expect(fmtGiBTick(0.5, 1)).toBe("0.5 GiB");
    expect(fmtGiBTick(0, 80)).toBe("0");
  });
});

describe("one formatter for counts and ranges", () => {
  it("writes significant digits without an exponent", () => {
    expect(sig(480)).toBe("480");
    expect(sig(12345)).toBe("12,300");
    expect(sig(0.00523)).toBe("0.00523");
    expect(sig(1.0)).toBe("1");
  });
  it("groups counts", () => {
    expect(fmtCount(262144)).toBe("262,144");
    expect(fmtCount(null)).toBe("–");
  });
  it("states a negative headroom as a shortfall, never '-105.5--3.5 GiB'", () => {
    expect(fmtGiBRange([-105.5, -3.5])).toBe("short by 3.5–105.5 GiB");
    expect(fmtGiBRange([-3.5, 10])).toBe("short by up to 3.5 GiB, up to 10.0 GiB to spare");
    expect(fmtGiBRange([9, 17])).toBe("9.0–17.0 GiB");
    expect(fmtGiBRange([0.002, 0.004])).toBe("2.0–4.1 MiB");
    expect(fmtGiBRange([2581, 5734])).toBe("2.5–5.6 TiB");
    expect(fmtGiBRange(null)).toBe("–");
  });
  it("writes a range of durations in units people read, never '871.08-1.82k s'", () => {
    expect(fmtRange([871.08, 1820], fmtSeconds)).toBe("14 min 31 s – 30 min 20 s");
    expect(fmtRange([9.46, 19.8], fmtSeconds)).toBe("9.46–19.8 s");
    expect(fmtRange([-3, 4], (v) => String(v))).toBe("-3 to 4");
    expect(fmtRange([5, 5], (v) => String(v))).toBe("5");
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
    expect(parseSeq("262,144")).toBe(262144);            // as the page prints it
    expect(parseSeq("262 144")).toBe(262144);
    expect(parseSeq("256K")).toBe(262144);
    expect(parseSeq("256 k")).toBe(262144);
    expect(parseSeq("26,21,44")).toBeNaN();
    expect(parseSeq("1,5M")).toBeNaN();
    expect(parseSeq("12 tokens")).toBeNaN();
    expect(parseSeq("")).toBeNaN();
    for (const n of [512, 4096, 131072, 1 << 20]) expect(parseSeq(fmtSeq(n))).toBe(n);
    for (const n of [512, 4096, 131072, 262144]) expect(parseSeq(fmtCount(n))).toBe(n);
  });
  it("reads whole numbers with thousands separators", () => {
    expect(parseWhole("1,024")).toBe(1024);
    expect(parseWhole(" 8 ")).toBe(8);
    expect(parseWhole("8.5")).toBeNaN();
    expect(parseWhole("1,02")).toBeNaN();
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
    expect(fmtDuration("2026-01-01T00:00:00", "2026-01-01T00:00:42")).toBe("42 s");
    expect(fmtDuration("2026-01-01T00:00:00", "2026-01-01T00:03:05")).toBe("3 min 5 s");
    expect(fmtDuration("2026-01-01T00:00:00", "2026-01-01T02:03:00")).toBe("2 h 3 min");
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
