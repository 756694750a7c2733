"""A rank imports its libraries with the garbage collector off (worker/trainer/rank.py `gc_off_for_imports`) and
`train.settle_imports()` collects once and turns it on: the automatic collections no longer walk the ~670,000
objects the imports make, again and again (bench/rank_imports.py measures the CPU)."""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys

import pytest

from tests.boundaries import ROOT
from tests.tiny import tiny_plan
from worker.trainer.rank import gc_off_for_imports

COUNT_COLLECTIONS = """
import gc, json, sys
seen = []
gc.callbacks.append(lambda phase, info: phase == "start" and seen.append(info["generation"]))
if sys.argv[1] == "off":
    from worker.trainer.rank import gc_off_for_imports
    before = len(seen)
    with gc_off_for_imports():
        import worker.trainer.train
        during = len(seen) - before
        worker.trainer.train.settle_imports()
else:
    before = len(seen)
    import worker.trainer.train
    during = len(seen) - before
print(json.dumps({"during": during, "on_after": gc.isenabled()}))
"""


def collections_while_importing(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", COUNT_COLLECTIONS, mode], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_trainers_imports_run_no_collection_and_the_collector_is_on_after():
    assert collections_while_importing("on")["during"] > 10  # what the imports cost before: collections throughout
    off = collections_while_importing("off")
    assert off["during"] == 0
    assert off["on_after"] is True


def test_the_collector_is_on_again_however_the_block_ends():
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_off_for_imports():
        assert not gc.isenabled()
        raise RuntimeError("an import failed")
    assert gc.isenabled()


RANK_ENTRY = """
import gc, json, sys
from worker.trainer import train
seen = {}
def rank(spec, run_dir, resume):
    seen["collector_on"] = gc.isenabled()
    return 0
train.train_this_rank = rank  # what run_train imports and enters for a one-rank plan
from worker.trainer.launcher import run_train
code = run_train(sys.argv[1], sys.argv[2], resume=False)
print(json.dumps({**seen, "code": code, "on_after": gc.isenabled()}))
"""


def test_a_rank_trains_from_imports_made_with_the_collector_off(tmp_path):
    """`ulab train` of a one-rank plan trains in its own process: the trainer's module is imported and its rank
    entered with the collector off (train_this_rank's settle_imports turns it on). In a child process: run_train
    takes the run directory's lock and tags the environment, as a launcher does."""
    data = tmp_path / "docs.txt"
    data.write_text("A few words of text for the tiny tokenizer to pack into rows.\n" * 400)
    plan = {**tiny_plan(sp_size=1, seq_len=64), "run": {"steps": 1, "data": {"path": str(data)}}}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    env = {k: v for k, v in os.environ.items() if k != "LOCAL_RANK"}
    out = subprocess.run([sys.executable, "-c", RANK_ENTRY, str(tmp_path / "plan.json"), str(tmp_path / "run")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"collector_on": False, "code": 0, "on_after": True}
