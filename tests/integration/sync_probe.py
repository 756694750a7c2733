"""One rank of a trainer run (started by torchrun) that counts the calls which make the host wait for the device,
inside each optimizer step: `Tensor.item`, `.tolist`, `.cpu`, `.numpy`, `bool()`, `float()`, `int()` of a tensor
and `torch.cuda.synchronize` / `Event.synchronize` / `Stream.synchronize`. On CPU ranks none of them waits, but each
one would on a GPU; counting them here is how a CPU test holds the step to its bound.

A step is from the Trainer's `on_step_begin` to its `on_step_end` (this probe's callback runs before every other
callback there: the metrics callback's one read of the step's figures comes after). Rank 0 writes
RUN_DIR/syncs.json: per step, the count and the calls by "call in function path:line" of the caller (the innermost
frame outside torch's own files; the path relative to the repository for our code, to site-packages for a library's).

    torchrun --nproc-per-node 2 -m tests.integration.sync_probe --plan P --run-dir D
"""
from __future__ import annotations

import json
import os
import sys
import traceback
from collections import Counter
from pathlib import Path

import torch

COUNTED = [(torch.Tensor, name) for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__",
                                                "__index__")]
COUNTED += [(torch.cuda, "synchronize"), (torch.cuda.Event, "synchronize"), (torch.cuda.Stream, "synchronize")]
TORCH_DIR = str(Path(torch.__file__).parent)
TREE = str(Path(__file__).resolve().parents[2])  # the repository this probe lies in: "our" code


class Counting:
    def __init__(self) -> None:
        self.on = False
        self.calls: Counter[str] = Counter()
        self.steps: list[dict] = []

    def where(self) -> str:
        """"function path:line" of the innermost caller outside torch; the path relative to the repository for our
        code, else to site-packages."""
        for frame in reversed(traceback.extract_stack()[:-2]):
            if not frame.filename.startswith(TORCH_DIR):
                path = frame.filename.removeprefix(TREE + "/").split("site-packages/")[-1]
                return f"{frame.name} {path}:{frame.lineno}"
        return "?"

    def patch(self, owner, name: str) -> None:
        original = getattr(owner, name)
        counting = self

        def counted(*args, **kwargs):
            if counting.on:
                counting.on = False  # calls made inside a counted call are its own
                try:
                    counting.calls[f"{name} in {counting.where()}"] += 1
                    return original(*args, **kwargs)
                finally:
                    counting.on = True
            return original(*args, **kwargs)

        setattr(owner, name, counted)


COUNTING = Counting()


def install() -> None:
    from transformers import TrainerCallback

    from worker.trainer import sp_trainer

    for owner, name in COUNTED:
        COUNTING.patch(owner, name)

    class StepBounds(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            COUNTING.calls.clear()
            COUNTING.on = True

        def on_step_end(self, args, state, control, **kw):
            COUNTING.on = False
            COUNTING.steps.append({"step": state.global_step, "count": sum(COUNTING.calls.values()),
                                   "calls": dict(COUNTING.calls)})

    init = sp_trainer.UlyssesTrainer.__init__

    def first_callback(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.callback_handler.callbacks.insert(0, StepBounds())

    sp_trainer.UlyssesTrainer.__init__ = first_callback  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    install()
    from worker.trainer.rank import main as trainer_main

    rc = trainer_main(argv)
    run_dir = Path(argv[argv.index("--run-dir") + 1])
    if os.environ.get("RANK", "0") == "0":
        (run_dir / "syncs.json").write_text(json.dumps(COUNTING.steps, indent=1))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
