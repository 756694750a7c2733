"""Per-rank entry point: `python -m worker.trainer --plan P --run-dir D [--resume]` (what torchrun starts)."""
import sys

from .cli import main

sys.exit(main())
