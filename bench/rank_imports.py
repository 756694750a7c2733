"""What a training rank's start-up imports cost, with the garbage collector on during them and as the trainer does it
now (worker/trainer/rank.py `gc_off_for_imports`, then `train.settle_imports`: one collection, freeze, on again).

Each round starts a fresh Python that imports what a CPU rank imports before its first step (the trainer,
DeepSpeed with mlflow hidden, Accelerate's parallelism config, the Trainer, the Llama model) and prints its CPU
seconds, peak RSS and the objects frozen; the two ways alternate, so a busy machine weighs on both alike. Prints
figures; asserts nothing. Usage: .venv/bin/python bench/rank_imports.py [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import gc, json, resource, sys
mode = sys.argv[1]
if mode == "off":
    from worker.trainer.rank import gc_off_for_imports
    block = gc_off_for_imports()
else:
    import contextlib
    block = contextlib.nullcontext()
with block:
    import worker.trainer.train as t
    t.import_deepspeed()
    import transformers.models.llama.modeling_llama  # noqa: F401
    if mode == "off":
        t.settle_imports()
    else:  # the collector stayed on through the imports; settle_imports as it was before
        import accelerate.parallelism_config  # noqa: F401
        from transformers import Trainer  # noqa: F401
        gc.collect()
        gc.freeze()
    on = gc.isenabled()
r = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"cpu_s": r.ru_utime + r.ru_stime, "peak_rss_mib": r.ru_maxrss / 1024,
                  "frozen": gc.get_freeze_count(), "gc_on_after": on}))
"""


def one(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    seen: dict[str, list[dict]] = {"on": [], "off": []}
    for i in range(a.rounds):
        for mode in ("on", "off"):
            seen[mode].append(one(mode))
            r = seen[mode][-1]
            print(f"round {i + 1}, collector {mode:3} during imports: {r['cpu_s']:.2f} CPU-s, peak RSS "
                  f"{r['peak_rss_mib']:.0f} MiB, {r['frozen']:,} objects frozen, on after: {r['gc_on_after']}",
                  flush=True)
    for mode, label in (("on", "on during imports (before)"), ("off", "off during imports, one collection (now)")):
        cpu = [r["cpu_s"] for r in seen[mode]]
        print(f"{label}: median {statistics.median(cpu):.2f} CPU-s (min {min(cpu):.2f}, max {max(cpu):.2f}), "
              f"peak RSS {statistics.median(r['peak_rss_mib'] for r in seen[mode]):.0f} MiB")


if __name__ == "__main__":
    main()
