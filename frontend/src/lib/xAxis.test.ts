import { describe, expect, it } from "vitest";
import { remap, stepTo } from "./xAxis";

const AXES = { step: [1, 11, 21], wall_s: [0, 20, 60], tokens: [512, 5632, 10752] };

describe("stepTo", () => {
  it("is the step itself by step", () => {
    expect(stepTo("step", null)(7)).toBe(7);
  });
  it("interpolates the wall time and the tokens between known steps", () => {
    expect(stepTo("time", AXES)(1)).toBe(0);
    expect(stepTo("time", AXES)(6)).toBe(10);
    expect(stepTo("time", AXES)(16)).toBe(40);
    expect(stepTo("tokens", AXES)(21)).toBe(10752);
    expect(stepTo("tokens", AXES)(2)).toBeCloseTo(1024, 9);
  });
  it("has no position outside the known steps or without a clock", () => {
    expect(stepTo("time", AXES)(0)).toBeNull();
    expect(stepTo("time", AXES)(22)).toBeNull();
    expect(stepTo("time", { ...AXES, wall_s: [0, null, 60] })(5)).toBeNull();
    expect(stepTo("tokens", null)(5)).toBeNull();
  });
});

describe("remap", () => {
  it("drops points with no position and keeps x non-decreasing", () => {
    const to = (s: number) => (s === 3 ? null : s === 4 ? 1 : s * 10);
    const out = remap([1, 2, 3, 4], [{ values: [5, 6, 7, 8] }], to);
    expect(out.x).toEqual([10, 20, 20]);
    expect(out.lines[0].values).toEqual([5, 6, 8]);
  });
});
