#!/usr/bin/env python3
"""Checks a planner command against docs/plan-v1.md: shapes, invariants and constraint errors.

The project's contract checker (kept verbatim from the contract's authors, with this docstring's paths updated).

Usage: check_plan_contract.py ULAB      (ULAB = path of the `ulab` console script)
Exit 0 when every check holds; prints one line per failed check, and a summary last.
It checks the contract, not accuracy: the numbers only have to be consistent with each other.
"""
import json, os, subprocess, sys, tempfile

ULAB = sys.argv[1] if len(sys.argv) > 1 else "ulab"
BASE = {
    "model": {"preset": "Qwen/Qwen3-4B"},
    "hardware": {"gpu": "H100-80GB", "gpus_per_node": 4, "num_nodes": 1},
    "parallel": {"sp_size": 4, "dp_size": 1},
    "training": {"seq_len": 32768, "micro_batch_size": 1, "grad_accum": 8, "dtype": "bf16", "zero_stage": 3,
                 "offload_optimizer": True, "offload_params": False, "activation_checkpointing": True,
                 "checkpoint_offload": False, "tiled_mlp": False, "tiled_logits_loss": False,
                 "attn_implementation": "flash_attention_2"},
}
BREAKDOWN = {"params", "grads", "optimizer", "activations", "logits_and_loss", "zero_buffers", "comm_buffers",
             "framework_overhead"}
failures = []

def variant(**changes):
    p = json.loads(json.dumps(BASE))
    for dotted, value in changes.items():
        section, key = dotted.split("__")
        p[section][key] = value
    return p

def run(plan, *flags):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(plan, f)
    try:
        r = subprocess.run([ULAB, "plan", "--json", f.name, *flags], capture_output=True, text=True, timeout=60)
    finally:
        os.unlink(f.name)
    try:
        return r.returncode, json.loads(r.stdout)
    except json.JSONDecodeError:
        return r.returncode, None

def check(cond, what):
    if not cond:
        failures.append(what)
    return cond

code, e = run(BASE)
if check(e is not None, "valid plan: output is not JSON"):
    check(e.get("valid") is True and e.get("errors") == [], "valid plan: valid must be true with errors []")
    m, t = e.get("memory") or {}, e.get("throughput") or {}
    for k in ("peak_allocated_gib", "device_total_gib", "gpu_capacity_gib", "fits", "breakdown_gib", "cpu_gib_per_node", "cpu_fits"):
        check(k in m, f"memory.{k} missing")
    for k in ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "time_breakdown_s"):
        check(k in t, f"throughput.{k} missing")
    b = m.get("breakdown_gib") or {}
    check(BREAKDOWN <= set(b), f"breakdown_gib lacks {sorted(BREAKDOWN - set(b))}")
    if b and "peak_allocated_gib" in m:
        check(abs(sum(b.values()) - m["peak_allocated_gib"]) <= 0.01 * max(1.0, m["peak_allocated_gib"]),
              f"breakdown sums to {sum(b.values()):.2f}, peak_allocated_gib is {m['peak_allocated_gib']}")
    if "device_total_gib" in m and "peak_allocated_gib" in m:
        check(m["device_total_gib"] >= m["peak_allocated_gib"], "device_total_gib below peak_allocated_gib")
        lo, hi = m.get("device_total_gib_range") or (None, None)
        check(lo is not None and lo <= m["device_total_gib"] <= hi, "device_total_gib_range does not hold device_total_gib")
        cap = m.get("gpu_capacity_gib", 0)
        want = "fits" if hi is not None and hi <= cap else "tight" if lo is not None and lo <= cap else "does_not_fit"
        check(m.get("verdict") == want, f"verdict {m.get('verdict')} disagrees with the range vs capacity ({want})")
        check(m.get("fits") == (m.get("verdict") == "fits"), "fits disagrees with verdict == 'fits'")
    check(abs(m.get("gpu_capacity_gib", 0) - 80) < 1.5, "H100-80GB capacity should be about 80 GiB")
    if t.get("tokens_per_s") and t.get("step_time_s"):
        tokens = 32768 * 8  # seq_len * grad_accum * micro_batch * dp
        check(abs(t["tokens_per_s"] * t["step_time_s"] - tokens) <= 0.02 * tokens, "tokens_per_s * step_time_s is not the tokens of one step")
        check(abs(t["tokens_per_s_per_gpu"] * 4 - t["tokens_per_s"]) <= 0.02 * t["tokens_per_s"], "tokens_per_s_per_gpu * gpus != tokens_per_s")
    check(0 < t.get("mfu", 0) < 1, "mfu must be a fraction in (0, 1)")

# Monotonic physics: longer sequences never need less memory; more SP ranks never need more per GPU.
mems = []
for s in (8192, 32768, 65536, 131072):
    _, e2 = run(variant(training__seq_len=s))
    mems.append(((e2 or {}).get("memory") or {}).get("peak_allocated_gib"))
check(None not in mems and mems == sorted(mems), f"peak memory not increasing with seq_len: {mems}")
_, e8 = run(variant(parallel__sp_size=8, hardware__gpus_per_node=8, training__seq_len=131072))
_, e4 = run(variant(training__seq_len=131072))
try:
    check(e8["memory"]["peak_allocated_gib"] < e4["memory"]["peak_allocated_gib"], "sp_size 8 does not need less memory per GPU than 4")
except (TypeError, KeyError):
    failures.append("sp_size 8 vs 4 comparison: missing memory")
_, et = run(variant(training__seq_len=131072, training__tiled_logits_loss=True))
try:
    check(et["memory"]["breakdown_gib"]["logits_and_loss"] < e4["memory"]["breakdown_gib"]["logits_and_loss"], "tiled logits loss does not shrink logits_and_loss")
except (TypeError, KeyError):
    failures.append("tiled logits loss comparison: missing breakdown")

# Constraint errors name the field.
bad = {
    "seq_len not divisible by sp_size": (variant(training__seq_len=32771), "training.seq_len"),
    "heads not divisible by sp_size": (variant(parallel__sp_size=3, hardware__gpus_per_node=3, training__seq_len=24576), "parallel.sp_size"),
    "world size mismatch": (variant(hardware__gpus_per_node=8), ("hardware", "parallel")),
    "unknown preset": ({**BASE, "model": {"preset": "no/such-model"}}, "model"),
    "unknown gpu": (variant(hardware__gpu="Z9000"), "hardware.gpu"),
}
for what, (plan, field) in bad.items():
    _, e3 = run(plan)
    if check(e3 is not None, f"{what}: output is not JSON"):
        errs = e3.get("errors") or []
        check(e3.get("valid") is False and any(str(x.get("field", "")).startswith(field if isinstance(field, tuple) else (field,)) for x in errs),
              f"{what}: want valid=false and an error on {field}, got {errs}")

code, em = run(BASE, "--max-seq")
if check(em is not None and isinstance(em.get("max_seq_len"), int), "--max-seq: no integer max_seq_len"):
    check(em["max_seq_len"] % 4 == 0, "--max-seq: max_seq_len not a multiple of sp_size")
    check(em.get("safe") == em["max_seq_len"] and 0 < em["max_seq_len"] <= em.get("likely", 0),
          "--max-seq: want safe == max_seq_len and 0 < max_seq_len <= likely")
    _, at = run(variant(training__seq_len=em["likely"]))
    _, over = run(variant(training__seq_len=em["likely"] + 4 * 1024))
    _, safe = run(variant(training__seq_len=em["max_seq_len"]))
    _, past = run(variant(training__seq_len=em["max_seq_len"] + 4 * 1024))

    def point_fits(e):
        m = (e or {}).get("memory", {})
        return m.get("device_total_gib", 1e9) <= m.get("gpu_capacity_gib", 0)
    check(point_fits(at), "--max-seq: the likely answer's point estimate does not fit")
    check(not point_fits(over), "--max-seq: 4K tokens past likely still fits")
    check((safe or {}).get("memory", {}).get("fits") is True, "--max-seq: max_seq_len's memory.fits is not true")
    check((past or {}).get("memory", {}).get("fits") is False, "--max-seq: 4K tokens past max_seq_len still fits")

for f in failures:
    print("FAIL:", f)
print(f"plan-v1 contract: {len(failures)} failed checks")
sys.exit(1 if failures else 0)
