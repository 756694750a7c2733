import { describe, expect, it } from "vitest";
import { eta } from "./Header";
import type { Store } from "./useRunData";

function storeWith(times: [number, number][]): Store {
  return new Map([["step_time_s", new Map([[0, new Map(times)]])]]);
}

describe("eta", () => {
  it("uses the planner's step time until a step is measured", () => {
    expect(eta(new Map(), 100, 2.5)).toEqual({ seconds: 250, source: "predicted" });
    expect(eta(new Map(), 100, null)).toBeNull();
  });
  it("switches to the median of the measured steps once they arrive", () => {
    const e = eta(storeWith([[1, 9], [2, 3], [3, 4]]), 10, 2.5);
    expect(e).toEqual({ seconds: 40, source: "measured" });
  });
  it("has nothing left to say when the run is at its last step", () => {
    expect(eta(storeWith([[1, 3]]), 0, 2.5)).toBeNull();
  });
});
