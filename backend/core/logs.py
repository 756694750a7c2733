"""The API's own log lines, and reading the end of a log file without reading all of it (a run's train.log grows
for days)."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

BYTES_PER_LINE = 256  # how far back to seek per line asked for; a longer line comes back cut at its start


def tail_lines(path: Path, lines: int) -> list[str]:
    """The last `lines` lines of the file (undecodable bytes replaced); [] if there is no such file."""
    if not path.is_file():
        return []
    with path.open("rb") as f:
        f.seek(0, 2)
        f.seek(max(0, f.tell() - BYTES_PER_LINE * lines))
        return f.read().decode("utf-8", "replace").splitlines()[-lines:]


def configure_service_logging(level: int = logging.INFO) -> None:
    """Send the `backend.*` loggers' lines (re-sent queued runs, lost runs, calibration loads) to stderr, beside
    uvicorn's. Without it Python keeps only warnings. Idempotent: each API process (uvicorn worker) calls it once."""
    logger = logging.getLogger("backend")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(level)
