"""Records the CUDA caching allocator's own trace in every Python process started with this directory first on
PYTHONPATH (bench/allocator_replay.py's GPU check: `--snapshot` replays the trace it writes):

    PYTHONPATH=bench/alloc_history ULAB_ALLOC_HISTORY=/tmp/alloc ulab train ...

torch.cuda.memory._record_memory_history (no stack frames, up to 2,000,000 events) from the interpreter's start, so
the model's build and DeepSpeed's initialisation are in the trace with the steps; each process that used CUDA
dumps its snapshot (torch.cuda.memory._dump_snapshot: segments plus `device_traces`) to
$ULAB_ALLOC_HISTORY/<pid>.pickle at exit. Does nothing without ULAB_ALLOC_HISTORY or without CUDA.
"""
import atexit
import os

_OUT = os.environ.get("ULAB_ALLOC_HISTORY")

if _OUT:
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=2_000_000)

        @atexit.register
        def _dump() -> None:
            if torch.cuda.is_initialized():
                os.makedirs(_OUT, exist_ok=True)
                torch.cuda.memory._dump_snapshot(os.path.join(_OUT, f"{os.getpid()}.pickle"))
