"""The trainer's own collectives on a device-strict process group, and the shared-run-directory check.

An NCCL group serves CUDA tensors only; a collective handed a CPU tensor fails at once ("No backend type associated
with device type cpu"), which is what every multi-GPU run hit at step 1 when the per-step metrics gather sent a
CPU tensor. `init_process_group("cuda:gloo")` builds the same device-strict group on a CPU machine. There the
callback must hand the group a tensor on the device the group serves: on a CPU-only torch that means it reaches for
CUDA (and fails there, before the group sees anything), never the group's "no backend for cpu" refusal.
"""
from __future__ import annotations

import json
import os
import traceback
from pathlib import Path

import pytest
import torch.multiprocessing as mp

WORLD = 2
BACKENDS = ("gloo", "cuda:gloo")


def _rank(rank: int, out: str) -> None:
    for backend in BACKENDS:  # one process pair for every check: starting ranks costs more than the checks
        _step_on(rank, backend, str(Path(out, f"store-{backend.replace(':', '-')}")), out)
    _run_dirs(rank, out)


def _run_dirs(rank: int, out: str) -> None:
    """Two "nodes" (one rank each): first with one run directory, then each with its own."""
    import torch.distributed as dist

    from worker.trainer import collectives

    collectives.SHARED_WAIT_S = 0.5  # no filesystem cache to wait out here
    dist.init_process_group("gloo", init_method=f"file://{out}/store-dirs", rank=rank, world_size=WORLD)
    result = {}
    for case, run_dir in (("shared", Path(out, "run")), ("unshared", Path(out, f"run-node{rank}"))):
        run_dir.mkdir(exist_ok=True)
        try:
            dist.barrier()
            collectives.check_shared_run_dir(run_dir, rank, WORLD, nodes=WORLD)
            result[case] = "ok"
        except collectives.RunDirNotShared as e:
            result[case] = str(e)
        dist.barrier()
    dist.destroy_process_group()
    Path(out, f"dirs-rank{rank}.json").write_text(json.dumps(result))


def _step_on(rank: int, backend: str, store: str, out: str) -> None:
    import torch.distributed as dist
    from transformers import LlamaConfig, TrainerControl, TrainerState

    from worker.trainer.callbacks import StepMetricsCallback
    from worker.trainer.collectives import collective_device
    from worker.trainer.metrics import MemoryMeter

    class Trainer:  # the figures StepMetricsCallback reads from UlyssesTrainer
        step_targets, last_lr, last_grad_norm, loss_sum, loss_steps = 100, 1e-3, 1.0, 0.0, 0

        def take_step_figures(self):
            return 0.5 + rank, 64

        def take_step_phases(self):
            return {"forward_s": 0.1, "backward_s": 0.2, "optimizer_s": 0.05}

    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=WORLD)
    result: dict = {"device": str(collective_device()) if "cpu" in dist.get_backend_config() else None}
    try:
        cb = StepMetricsCallback(Trainer(), writer=None, step_offset=0, stage_index=0, seq_len=64,
                                 model_config=LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                          intermediate_size=128, vocab_size=512),
                                 peak_tflops=None, checkpoint_every=0, memory=MemoryMeter(False))
        state = TrainerState()
        state.global_step = 1
        cb.on_step_end(None, state, TrainerControl())
        result["loss"] = cb.trainer.loss_sum
    except BaseException as e:  # reported to the test
        result["error"] = f"{type(e).__name__}: {e}"
        result["trace"] = traceback.format_exc()
    finally:
        # no rank tears its group down before every rank is through: a cuda:gloo group runs no collective here, so
        # rank 0 was once done and closed its sockets while rank 1, slower under load, was still in gloo's
        # connectFullMesh ("Connection closed by peer"). The rendezvous store serves as the barrier.
        store = dist.distributed_c10d._get_default_store()
        store.set(f"through/{rank}", "1")
        store.wait([f"through/{r}" for r in range(WORLD)])
        try:
            dist.destroy_process_group()
        except Exception:
            pass
    Path(out, f"{backend}-rank{rank}.json").write_text(json.dumps(result))


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, list[dict]]:
    out = tmp_path_factory.mktemp("collectives")
    os.environ.setdefault("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    mp.spawn(_rank, args=(str(out),), nprocs=WORLD, join=True)
    names = (*BACKENDS, "dirs")
    return {b: [json.loads((out / f"{b}-rank{r}.json").read_text()) for r in range(WORLD)] for b in names}


def test_the_step_metrics_gather_never_hands_a_cuda_only_group_a_cpu_tensor(results):
    for r in results["cuda:gloo"]:
        error = r.get("error", "")
        assert "No backend type associated with device type cpu" not in error, r.get("trace")
        # the callback asked for this rank's CUDA device, which a CPU-only torch does not have
        assert "CUDA" in error, r


def test_on_gloo_every_rank_gets_the_whole_table(results):
    results = results["gloo"]
    assert [r.get("error") for r in results] == [None, None], results[0].get("trace")
    assert {r["device"] for r in results} == {"cpu"}
    assert [r["loss"] for r in results] == [2.0, 2.0]  # 0.5 + 1.5: every rank's share, on every rank


def test_ranks_on_other_nodes_must_see_the_run_directory_rank_0_writes(results):
    """Only global rank 0 writes trainer_state.json and the stage hand-off: a node with its own run directory
    would lose resume and stage chaining, so the ranks check at start that they share one."""
    assert [r["shared"] for r in results["dirs"]] == ["ok", "ok"]
    for r in results["dirs"]:
        assert r["unshared"].startswith("hardware.num_nodes=2: ranks [1] do not see"), r
        assert "ULAB_RUNS_DIR" in r["unshared"]
