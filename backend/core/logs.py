"""The API's own log lines, and reading the end of a log file without reading all of it (a run's train.log grows
for days)."""
from __future__ import annotations

import logging
import re
import sys
from collections import deque
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


# The prefix torchrun gives each line a rank writes (TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, plan.launch.RANK_PREFIX):
# "[rank3]: ..." with the global rank. Lines without it are the launcher's, torchrun's or the worker's.
RANK_LINE = re.compile(r"^\[rank(\d+)\]: ?")


def line_source(line: str) -> int | None:
    """The global rank that wrote the line, or None for the launcher (`ulab train`, torchrun, the worker)."""
    m = RANK_LINE.match(line)
    return int(m.group(1)) if m else None


def filter_lines(path: Path, *, rank: int | None = None, launcher: bool = False, query: str | None = None,
                 limit: int | None = None, one_process: bool = False) -> list[str]:
    """Lines of a trainer log that one rank wrote (its prefix taken off), or that the launcher wrote, or all of them;
    only those containing `query` (case-insensitive) if given; the last `limit` of them. Reads the whole file once,
    keeping only what it answers. A run of one rank (`one_process`) trains in the launcher's own process, without
    torchrun: every line is both rank 0's and the launcher's."""
    if not path.is_file():
        return []
    needle = query.lower() if query else None
    by_source = not one_process and (rank is not None or launcher)
    kept: deque[str] = deque(maxlen=limit)
    with path.open("rb") as f:
        for raw in f:
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if by_source:
                m = RANK_LINE.match(line)
                if launcher != (m is None) or (m is not None and int(m.group(1)) != rank):
                    continue
                if m is not None:
                    line = line[m.end():]
            elif one_process and rank not in (None, 0):
                continue
            if needle is None or needle in line.lower():
                kept.append(line)
    return list(kept)


# A token a URL carries in its query: a run's share link (backend/runs/share.py QUERY, where no header can go: the
# live stream's EventSource, a download link). The access log keeps the parameter's name and drops its value.
QUERY_TOKEN = re.compile(r"(?<=[?&]share=)[^&\s\"]+")
REDACTED = "[redacted]"


class RedactQueryTokens(logging.Filter):
    """Blank the share token of every request line uvicorn's access log writes ("GET /api/runs/3/stream?share=...")."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(QUERY_TOKEN.sub(REDACTED, a) if isinstance(a, str) else a for a in record.args)
        if isinstance(record.msg, str):
            record.msg = QUERY_TOKEN.sub(REDACTED, record.msg)
        return True


def configure_service_logging(level: int = logging.INFO) -> None:
    """Send the `backend.*` loggers' lines (re-sent queued runs, lost runs, calibration loads) to stderr, beside
    uvicorn's, and keep share tokens out of uvicorn's access log. Without it Python keeps only warnings. Idempotent:
    each API process (uvicorn worker) calls it once."""
    logger = logging.getLogger("backend")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(level)
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactQueryTokens) for f in access.filters):
        access.addFilter(RedactQueryTokens())
