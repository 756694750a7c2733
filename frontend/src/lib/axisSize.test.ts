import { describe, expect, it } from "vitest";
import { axisSize, MIN_AXIS_PX } from "./axisSize";

// a monospace stand-in for the canvas: 7 px per character
const measure = (text: string) => text.length * 7;

describe("axisSize", () => {
  it("fits the widest tick label", () => {
    const size = axisSize(["8.7 MiB", "9.22 MiB", "9.73 MiB"], "12px sans-serif", measure, 10, 5);
    expect(size).toBeGreaterThanOrEqual(10 + 5 + "9.73 MiB".length * 7);
  });
  it("grows with the labels, beyond a fixed 64 px", () => {
    const size = axisSize(["1,048,576 tokens/s"], "12px sans-serif", measure, 10, 5);
    expect(size).toBeGreaterThan(64);
  });
  it("never collapses below the minimum, blank ticks included", () => {
    expect(axisSize(["", "1"], "12px sans-serif", measure, 4, 2)).toBe(MIN_AXIS_PX);
    expect(axisSize(null, "12px sans-serif", measure, 4, 2)).toBe(MIN_AXIS_PX);
  });
});
