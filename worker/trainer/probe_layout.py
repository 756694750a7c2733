"""Where a probe's depths live in its output folder: shared by the launcher (worker/probe.py, which `ulab probe`,
the Celery task and the Slurm job import) and the ranks (probe_ranks.py). A module of its own so that the launcher
does not load torch and Transformers with the ranks' code (1.7 CPU-s for every `ulab job` and probe launch)."""
from __future__ import annotations

from pathlib import Path

DONE = "done"  # OUT/depth-N/DONE: every rank trained this depth to its end


def depth_dir(out: Path, depth: int) -> Path:
    return Path(out) / f"depth-{depth}"
