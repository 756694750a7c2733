"""`python -m worker.trainer --plan P --run-dir D [--resume]`: `ulab train`, the launcher (launcher.py). Each rank it
starts runs `python -m worker.trainer.rank`."""
import sys

from .launcher import main

sys.exit(main())
