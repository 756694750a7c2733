"""Allocation traces from inside the trainer's processes, for bench/allocator_replay.py. Active only in a Python
process started with this directory first on PYTHONPATH and one of these variables set:

ULAB_ALLOC_HISTORY=DIR (GPU, torchrun's workers only): torch.cuda.memory._record_memory_history (no stack frames,
    up to 2,000,000 events) from the interpreter's start, so the model's build and DeepSpeed's initialisation are
    in the trace with the steps; each process that used CUDA dumps its snapshot (torch.cuda.memory._dump_snapshot:
    segments plus `device_traces`) to DIR/<pid>.pickle at exit. `allocator_replay.py --snapshot` replays it.

ULAB_ALLOC_CPU_TRACE=DIR (CPU ranks): every allocation from `deepspeed.initialize` on (DeepSpeed's engine and ZeRO
    optimizer, then each training step: forward, backward with DeepSpeed's gradient hooks, the optimizer step),
    as ("alloc", id, bytes) / ("free", id, 0) / ("empty_cache", 0, 0) events in order, with an ("init_end", 0, 0)
    marker when initialize returns and a ("step_end", 0, 0) after each DeepSpeedEngine.step; written to
    DIR/<pid>.json at exit. The engine's `module.to(device)` is a no-op on CPU; on a GPU it allocates every
    parameter and buffer on the device, so their storages open the sequence (module order). Each storage an
    operation returns is followed through a weakref (its death is the free); DeepSpeed's accelerator.empty_cache()
    (a no-op on CPU) is recorded where it is called.
"""
import atexit
import os

# Only in the training ranks (torchrun sets LOCAL_RANK in its workers): `ulab train` and torchrun themselves never
# touch the device, and recording there would start CUDA in them (torch's recordHistory initialises the device).
if os.environ.get("ULAB_ALLOC_HISTORY") and "LOCAL_RANK" in os.environ:
    _OUT = os.environ["ULAB_ALLOC_HISTORY"]
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        try:
            torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                                     max_entries=2_000_000)
        except Exception as e:  # a measurement aid must not stop the rank it measures
            print(f"alloc history: not recorded ({type(e).__name__}: {e})", flush=True)
        else:
            @atexit.register
            def _dump() -> None:
                if torch.cuda.is_initialized():
                    os.makedirs(_OUT, exist_ok=True)
                    torch.cuda.memory._dump_snapshot(os.path.join(_OUT, f"{os.getpid()}.pickle"))

if os.environ.get("ULAB_ALLOC_CPU_TRACE"):
    import functools
    import json
    import weakref

    import deepspeed
    import torch
    from deepspeed.runtime.engine import DeepSpeedEngine
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves
    from torch.utils.weak import WeakIdKeyDictionary

    class _Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.events = []
            self.seen = WeakIdKeyDictionary()

        def storage(self, st) -> None:
            if st in self.seen or st.nbytes() == 0:
                return
            i = len(self.events)
            self.events.append(("alloc", i, st.nbytes()))
            self.seen[st] = weakref.ref(st, lambda _, i=i: self.events.append(("free", i, 0)))

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and not t.is_meta:
                    self.storage(t.untyped_storage())
            return out

    _REC = _Recorder()
    _initialize, _step = deepspeed.initialize, DeepSpeedEngine.step

    @functools.wraps(_initialize)
    def _recorded_initialize(*args, **kwargs):
        model = kwargs.get("model", args[1] if len(args) > 1 else None)
        for t in [*model.parameters(), *model.buffers()]:  # module.to(device) on a GPU
            _REC.storage(t.untyped_storage())
        deepspeed.accelerator.get_accelerator().empty_cache = lambda: _REC.events.append(("empty_cache", 0, 0))
        _REC.__enter__()  # stays on for the rest of the process: the steps are recorded too
        result = _initialize(*args, **kwargs)
        _REC.events.append(("init_end", 0, 0))
        return result

    @functools.wraps(_step)
    def _recorded_step(self, *args, **kwargs):
        result = _step(self, *args, **kwargs)
        _REC.events.append(("step_end", 0, 0))
        return result

    deepspeed.initialize, DeepSpeedEngine.step = _recorded_initialize, _recorded_step

    @atexit.register
    def _write() -> None:
        if _REC.events:
            os.makedirs(os.environ["ULAB_ALLOC_CPU_TRACE"], exist_ok=True)
            with open(os.path.join(os.environ["ULAB_ALLOC_CPU_TRACE"], f"{os.getpid()}.json"), "w") as f:
                json.dump(_REC.events, f)
