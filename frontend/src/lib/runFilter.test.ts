import { describe, expect, it } from "vitest";
import { matches, parseFilter } from "./runFilter";

const RUN = {
  id: 3, name: "lr sweep 1", state: "succeeded", final_loss: 4.3, tags: ["baseline", "64k"],
  spec: { model: { preset: "meta-llama/Llama-3.1-8B" }, parallel: { sp_size: 4, dp_size: 2 },
    training: { seq_len: 65536, zero_stage: 3 }, run: { learning_rate: 0.001, steps: 600 } },
  estimate: { memory: { verdict: "tight" } },
};

const ok = (text: string, extra = {}) => {
  const { clauses, error } = parseFilter(text);
  expect(error).toBeNull();
  return matches(RUN, clauses, extra);
};

describe("run filter", () => {
  it("reads any plan field, with the page's number forms", () => {
    expect(ok("training.seq_len>=64K")).toBe(true);
    expect(ok("training.seq_len>=65,537")).toBe(false);
    expect(ok("parallel.sp_size=4, training.zero_stage=3")).toBe(true);
    expect(ok("run.learning_rate<1e-2")).toBe(true);
    expect(ok("run.learning_rate=0.01")).toBe(false);
    expect(ok("model.preset~llama")).toBe(true);
  });
  it("reads final metrics, run fields and what the page measured", () => {
    expect(ok("final_loss<4.5")).toBe(true);
    expect(ok("final_loss<4")).toBe(false);
    expect(ok("state=SUCCEEDED")).toBe(true);
    expect(ok("estimate.memory.verdict=tight")).toBe(true);
    expect(ok("tags=64k")).toBe(true);
    expect(ok("tags!=64k")).toBe(false);
    expect(ok("tokens_per_s>1000", { tokens_per_s: 1500 })).toBe(true);
  });
  it("treats a field the run lacks as not matching, except for !=", () => {
    expect(ok("training.document_len>0")).toBe(false);
    expect(ok("training.document_len!=5")).toBe(true);
  });
  it("names a clause that does not read", () => {
    expect(parseFilter("seq_len 64K").error).toContain('"seq_len 64K"');
    expect(parseFilter("").clauses).toEqual([]);
  });
});
