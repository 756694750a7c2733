#!/usr/bin/env bash
# Checks `ulab train` against docs/trainer-v1.md: a real 2-rank Ulysses SP run on CPU writes
# metrics.jsonl with the named keys, and its first-step loss equals a single process's on the same
# model and data. Usage: check_trainer_contract.sh PATH/TO/ulab [PATH/TO/python]
set -u
ULAB=$1; PY=${2:-$(dirname "$ULAB")/python}
here=$(cd "$(dirname "$0")" && pwd)
fail() { echo "$*"; exit 1; }
t=$(mktemp -d); trap 'rm -rf "$t"' EXIT
"$PY" "$here/tiny_plan.py" "$t/p2.json" "$t/data.txt" 2 || fail "could not write the plan"
"$PY" "$here/tiny_plan.py" "$t/p1.json" "$t/data.txt" 1 || fail "could not write the plan"
timeout 150 "$ULAB" train --plan "$t/p2.json" --run-dir "$t/r2" >"$t/log2" 2>&1 || fail "sp=2 run failed: $(tail -1 "$t/log2")"
timeout 100 "$ULAB" train --plan "$t/p1.json" --run-dir "$t/r1" >"$t/log1" 2>&1 || fail "sp=1 run failed: $(tail -1 "$t/log1")"
"$PY" - "$t" <<'PY'
import json, math, sys
t = sys.argv[1]
def load(d):
    return [json.loads(l) for l in open(f"{t}/{d}/metrics.jsonl") if l.strip()]
m2, m1 = load("r2"), load("r1")
need = {"step", "loss", "lr", "grad_norm", "tokens_per_s", "step_time_s", "peak_allocated_gib", "seq_len"}
missing = need - set(m2[0]) if m2 else need
assert not missing, f"metrics.jsonl lacks {sorted(missing)}"
assert len(m2) >= 8, f"sp=2 wrote {len(m2)} steps, want 8"
assert [m["step"] for m in m2[:8]] == list(range(1, 9)), "steps are not 1..8"
assert all(math.isfinite(m["loss"]) for m in m2), "non-finite loss"
assert len(m2[0]["peak_allocated_gib"]) == 2, "peak_allocated_gib does not list 2 ranks"
d = abs(m2[0]["loss"] - m1[0]["loss"]) / m1[0]["loss"]
assert d < 1e-4, f"step-1 loss sp=2 {m2[0]['loss']:.6f} vs sp=1 {m1[0]['loss']:.6f}"
print(f"trainer-v1 contract holds: sp=2 ran {len(m2)} steps; step-1 loss {m2[0]['loss']:.5f} vs single process {m1[0]['loss']:.5f} (rel diff {d:.1e})")
PY
