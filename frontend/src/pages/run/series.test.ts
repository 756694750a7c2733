import { describe, expect, it } from "vitest";
import { rankLabels } from "./series";

describe("rankLabels", () => {
  it("labels a rank whose line lies on an earlier one at more than half its steps", () => {
    const r0 = [5.19, 5.19, 5.312, 5.19];
    expect(rankLabels([0, 1], [r0, [5.19, 5.19, 5.19, 5.19]])).toEqual(["rank 0", "rank 1 (= rank 0 at 3/4 steps)"]);
  });

  it("leaves ranks apart when they agree at half the steps or fewer, or differ beyond 1e-3", () => {
    expect(rankLabels([0, 1], [[1, 2, 3, 4], [1, 2, 9, 9]])).toEqual(["rank 0", "rank 1"]);
    expect(rankLabels([0, 1], [[1, 1], [1.01, 1.01]])).toEqual(["rank 0", "rank 1"]);
  });

  it("counts only the steps a rank has, and names the earlier rank it matches best", () => {
    const labels = rankLabels([0, 1, 2], [[1, 2, 3], [7, 8, 9], [null, 8, 9]]);
    expect(labels[2]).toBe("rank 2 (= rank 1 at 2/2 steps)");
  });
});
