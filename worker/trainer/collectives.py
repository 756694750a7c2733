"""What the ranks of a run share besides the model: the device their collectives run on, the CPU cores of a node,
and the run directory of a multi-node run.

- NCCL serves CUDA tensors only; a collective handed a CPU tensor fails ("No backend type associated with device
  type cpu"). `collective_device()` answers the device the default group serves, so the trainer's own
  collectives work on NCCL (GPU) and gloo (CPU) alike. `init_process_group("cuda:gloo")` is such a device-strict
  group on a CPU machine (tests/integration/test_trainer_collectives.py).
- CPU threads: torchrun sets OMP_NUM_THREADS=1 for every rank, which leaves DeepSpeedCPUAdam (OpenMP) on one core
  per rank; `share_cores()` gives each rank its share of the cores this process may run on.
- Multi-node: only global rank 0 writes trainer_state.json, the checkpoints' model files and the stage hand-off
  (stages/stage{i}), so every node must see the same run directory. `check_shared_run_dir()` proves it at start.
"""
from __future__ import annotations

import itertools
import os
import time
import uuid
from pathlib import Path

import torch
import torch.distributed as dist

SHARED_MARKER = ".ulab-shared-run-dir"
# A shared filesystem may show a new file on other nodes only after its attribute cache expires (NFS: seconds)
SHARED_WAIT_S = float(os.environ.get("ULAB_SHARED_RUN_DIR_WAIT_S", "10"))


def collective_device() -> torch.device:
    """The device whose tensors the default process group serves: CPU when its backend map has one for CPU
    (gloo), else this rank's CUDA device (NCCL, or any CUDA-only map)."""
    if not dist.is_initialized():
        return torch.device("cpu")
    served = {d.type for d in dist.distributed_c10d._get_default_group()._device_types}
    if "cpu" in served:
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def all_gather_rows(row: torch.Tensor) -> torch.Tensor:
    """Every rank's `row` (a small 1-D tensor), stacked in rank order, on the CPU."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return row.unsqueeze(0)
    mine = row.to(collective_device())
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    return torch.stack(everyone).cpu()


def node_cores() -> int:
    """CPU cores this process may run on (its affinity: a container's or a scheduler's share, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def share_cores(ranks_on_node: int) -> int:
    """Give this rank cores // ranks_on_node threads, for torch's intra-op pool and for OpenMP (DeepSpeedCPUAdam
    reads OMP_NUM_THREADS when its extension loads, after this). Returns the count."""
    n = max(1, node_cores() // max(1, ranks_on_node))
    os.environ["OMP_NUM_THREADS"] = str(n)
    torch.set_num_threads(n)
    return n


_CHECKS = itertools.count()


class RunDirNotShared(RuntimeError):
    pass


def check_shared_run_dir(run_dir: Path, rank: int, world: int, nodes: int) -> None:
    """Rank 0 writes a marker with a fresh token into RUN_DIR; every rank must read that token there. Uses the
    rendezvous store (no tensors, so any backend). Raises RunDirNotShared naming the ranks that cannot see it."""
    store = dist.distributed_c10d._get_default_store()
    key = f"ulab/shared-run-dir/{next(_CHECKS)}"  # every rank calls this equally often: fresh keys per call
    marker = Path(run_dir) / SHARED_MARKER
    if rank == 0:
        token = uuid.uuid4().hex
        marker.write_text(token)
        store.set(f"{key}/token", token)
    token = store.get(f"{key}/token").decode()
    deadline = time.monotonic() + SHARED_WAIT_S
    while True:
        seen = marker.exists() and marker.read_text().strip() == token
        if seen or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    store.set(f"{key}/rank{rank}", "1" if seen else "0")
    blind = [r for r in range(world) if store.get(f"{key}/rank{r}") != b"1"]
    if blind:
        raise RunDirNotShared(
            f"hardware.num_nodes={nodes}: ranks {blind} do not see {marker} that rank 0 wrote: a run over several "
            f"nodes needs its run directory on a filesystem every node mounts at the same path (ULAB_RUNS_DIR)")
