"""The ranks of a probe (worker/probe.py): every depth of it in one launch.

`python -m worker.trainer.probe_ranks --out OUT --depths 1,2,4` under torchrun (or alone for a one-rank plan).
Each rank sets up its process group once, then trains OUT/depth-N/plan.json (a `ulab train` plan, its data already
packed in OUT/depth-N/data by the launcher) for each depth in turn, as `ulab train` would: the same stages, the same
metrics callback, so the per-depth figures mean what a run's do. Between depths the model, the DeepSpeed engine
and the Ulysses groups are released, and the peak statistics start over (CUDA: empty_cache and
reset_peak_memory_stats; CPU ranks: the tensor meter starts afresh at every step anyway).

Per depth, rank 0 writes OUT/depth-N/done once every rank finished it. A failure writes OUT/depth-N/outcome.json
(plan/outcome.py) and ends the launch with the trainer's exit code: torchrun then stops the other
ranks, and the launcher says which depths ran, which failed and which are left.
"""
from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import torch

from .attempt import metrics_file
from .callbacks import STOP, install_stop_handler
from .cpu_info import share_cpu_info
from .exits import EXIT_BAD_INPUT, EXIT_OK, Cause
from .metrics import MetricsWriter
from .probe_layout import DONE, depth_dir


def release_memory() -> None:
    """What one depth left behind is freed and the peaks start over, so the next depth measures only itself. The
    Trainer's DeepSpeed config stays registered with Transformers after its engine is gone: under ZeRO-3 the next
    depth's random model would be built inside zero.Init with the old config (the batch-size check fails), where the
    trainer builds a first stage's model outside it (train.run_stage)."""
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def train_depth(spec, run_dir: Path, depth: int, rank: int, attn: str, attention) -> None:
    """Every stage of one depth's plan (raises what the trainer raises); rank 0 writes its metrics file."""
    from .train import run_stage

    writer = None
    if rank == 0:
        mine = metrics_file(run_dir, 1)
        mine.unlink(missing_ok=True)
        writer = MetricsWriter(mine)
    try:
        for i in range(len(spec.stages)):
            if i > 0:
                attention.reset()
            cb = run_stage(spec, run_dir, i, resume_from=None, steps_done=0, attn=attn, writer=writer, rank=rank)
            if cb.stopped_by_signal:
                raise InterruptedError(f"preempted: signal {STOP['signal']} on rank {rank} at depth "
                                       f"{depth}")
            torch.distributed.barrier()
    finally:
        if writer is not None:
            writer.close()


def run_depths(out: Path, depths: list[int]) -> int:
    """Train each depth in turn in this rank; the trainer's exit code of the first that fails, else 0."""
    from plan.launch import effective_attn

    from .spec import PlanError, RunSpec, load_plan
    from .stage import SKIP_FINAL_SAVE_ENV
    from .train import (
        _Attention,
        _fail,
        close_distributed,
        failed,
        settle_imports,
        setup_distributed,
    )

    os.environ[SKIP_FINAL_SAVE_ENV] = "1"  # a random-weight model: nobody reads it
    install_stop_handler()
    rank = int(os.environ.get("RANK", "0"))
    run_dir = depth_dir(out, depths[0])
    if "LOCAL_RANK" in os.environ:  # a rank under torchrun: it joins the launcher's lock, and dies with torchrun
        from .attempt import LockBusy
        from .rank import join_run_dir

        try:
            join_run_dir(Path(out))
        except (LockBusy, OSError) as e:
            return _fail(run_dir, rank, f"error: {e}", Cause.ERROR)
    try:
        rank, world, device = setup_distributed()
        attention = None
        for n, depth in enumerate(depths):
            run_dir = depth_dir(out, depth)
            spec = RunSpec.from_plan(load_plan(run_dir / "plan.json"))
            if world != spec.world_size:
                raise RuntimeError(f"the plan needs {spec.world_size} ranks (sp_size*dp_size) but torchrun "
                                   f"started {world}")
            attn = effective_attn(spec.plan, cuda=device == "cuda")
            if spec.offload_optimizer:
                share_cpu_info()
            if attention is None:
                attention = _Attention(attn)
                settle_imports()
            elif n > 0:
                attention.reset()
            train_depth(spec, run_dir, depth, rank, attn, attention)
            release_memory()
            torch.distributed.barrier()
            if rank == 0:
                (run_dir / DONE).write_text("ok\n")
                print(f"probe: depth {depth} trained", flush=True)
        torch.distributed.barrier()
        return EXIT_OK
    except PlanError as e:
        return _fail(run_dir, rank, f"error: {e}", Cause.ERROR, exit_code=EXIT_BAD_INPUT)
    except InterruptedError as e:
        return _fail(run_dir, rank, str(e), Cause.SIGNAL, quiet_trace=True)
    except Exception as e:  # every failure ends with one line, as a training rank's
        return failed(run_dir, rank, e)
    finally:
        close_distributed()


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m worker.trainer.probe_ranks")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--depths", required=True, help="comma-separated layer counts, each with OUT/depth-N/plan.json")
    a = p.parse_args(argv)
    from .rank import gc_off_for_imports

    with gc_off_for_imports():  # until settle_imports(), as a training rank
        return run_depths(a.out, [int(x) for x in a.depths.split(",") if x.strip()])


if __name__ == "__main__":
    sys.exit(main())
