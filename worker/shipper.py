"""Ships the trainer's metrics files to the API in batches. The files are the buffer: a file's offset advances
only after the API has stored a batch, so nothing is lost while the API is down, and resends are harmless (the
API upserts on run, rank, step, name). Every attempt writes a file of its own (worker/trainer/attempt.py); they
are sent oldest attempt first, so where a resumed attempt redid a step, its line is the one that stays; files
older than the newest start from scratch are superseded and not sent (`current_files`).

A file is read by identity, not by name: its offset is kept with its inode and first bytes, and a file that was
replaced (another inode, or other first bytes) or truncated (shorter than the offset) is read again from its
start. A torn last line (being written, or left by a killed trainer) waits for its end; a whole line that is not
a step record is logged, never dropped silently. Each batch says the first step of the file it comes from
(`first_step`): the API counts a step as stored by the live attempt only from there
(backend/runs/transitions.missing_steps); and when its first step was written (`file_started`): the API's alerts look
only at the files the live attempt began (backend/runs/alerts.check)."""
from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path

import httpx

from worker.trainer.attempt import current_files, first_record

log = logging.getLogger(__name__)
MAX_BATCH_LINES = 2000
HEAD_BYTES = 512  # a line carries its wall time: two attempts' files differ in their first bytes


def line_to_points(record: dict) -> list[dict]:
    """One trainer line -> metric points: numbers on rank 0, lists of numbers one point per rank."""
    step = int(record["step"])
    wall = float(record.get("time", time.time()))
    points = []
    for name, value in record.items():
        if name in ("step", "time") or isinstance(value, bool):
            continue
        # a NaN/Inf loss or grad norm is shipped too: the API raises an alert for it (and does not store it)
        if isinstance(value, (int, float)) and (math.isfinite(value) or name in ("loss", "grad_norm")):
            points.append({"rank": 0, "step": step, "name": name, "value": float(value), "wall_time": wall})
        elif isinstance(value, list):
            points += [{"rank": r, "step": step, "name": name, "value": float(v), "wall_time": wall}
                       for r, v in enumerate(value)
                       if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    return points


class MetricShipper:
    def __init__(self, run_dir: Path, api_url: str, run_id: int, token: str, timeout_s: float = 5.0):
        self.run_dir, self.run_id = Path(run_dir), run_id
        self.url = f"{api_url.rstrip('/')}/api/runs/{run_id}/metrics"
        self.client = httpx.Client(timeout=timeout_s, headers={"Authorization": f"Bearer {token}"})
        # path -> (inode, bytes shipped, the file's first bytes): what tells the same file from a new one
        self.offsets: dict[Path, tuple[int, int, bytes]] = {}
        self.last_step = 0
        self.failures = 0
        self.refused: int | None = None  # the status of the last batch the API refused (4xx), None after a success
        self._next_try = 0.0

    def _read_new_lines(self, path: Path) -> tuple[list[str], tuple[int, int, bytes]]:
        with path.open("rb") as f:
            st = os.fstat(f.fileno())
            inode, offset, head = self.offsets.get(path, (st.st_ino, 0, b""))
            # the same file: the same inode (a new file may get a freed one), at least as long, the same first bytes
            if inode != st.st_ino or st.st_size < offset or (head and f.read(len(head)) != head):
                log.warning("run %s: %s was replaced or truncated; reading it again from its start", self.run_id,
                            path.name)
                inode, offset = st.st_ino, 0
            f.seek(offset)
            data = f.read()
            if offset == 0:
                head = data[:HEAD_BYTES]
        end = data.rfind(b"\n") + 1  # only whole lines; a line being written waits for the next call
        lines = data[:end].decode("utf-8", "replace").splitlines()[:MAX_BATCH_LINES]
        consumed = sum(len(line.encode("utf-8")) + 1 for line in lines) if len(lines) == MAX_BATCH_LINES else end
        return lines, (inode, offset + consumed, head[:offset + consumed])

    def ship(self) -> bool:
        """Send what is new in every attempt's file, oldest first; True when everything written so far is stored.
        Backs off after failures."""
        if time.monotonic() < self._next_try:
            return False
        return all(self._ship_file(path) for path in current_files(self.run_dir))

    def _ship_file(self, path: Path) -> bool:
        while True:
            lines, new_offset = self._read_new_lines(path)
            if not lines:
                return True
            points: list[dict] = []
            for line in lines:
                try:
                    record = json.loads(line)
                    points += line_to_points(record)
                    self.last_step = max(self.last_step, int(record["step"]))
                except (ValueError, KeyError, TypeError):
                    log.warning("run %s: skipping a metrics line that is not a step record: %.200s", self.run_id, line)
            try:
                # json.dumps, not httpx's json=: httpx refuses NaN, and a NaN loss must reach the API's alerts
                first = first_record(path)
                body = {"points": points, "first_step": int(first["step"]) if first else None,
                        "file_started": first.get("time") if first else None}
                r = self.client.post(self.url, content=json.dumps(body),
                                     headers={"Content-Type": "application/json"})
                r.raise_for_status()
            except httpx.HTTPError as e:
                # a refusal (the attempt ended or moved on: its token no longer writes) is not an outage
                status = e.response.status_code if isinstance(e, httpx.HTTPStatusError) else None
                self.refused = status if status is not None and 400 <= status < 500 and status not in (408, 429) \
                    else None
                self.failures += 1
                delay = min(30.0, 0.5 * 2 ** min(self.failures, 6))
                self._next_try = time.monotonic() + delay
                log.warning("run %s: could not ship metrics (%s); retrying in %.1fs", self.run_id, e, delay)
                return False
            self.failures, self.refused, self.offsets[path] = 0, None, new_offset

    def drain(self, deadline_s: float) -> bool:
        """After the trainer exits: keep trying while the API cannot be reached, until all is shipped or the deadline
        passes; a refusal ends it at once (no later try would be taken)."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            self._next_try = min(self._next_try, time.monotonic() + 1.0)
            if self.ship():
                return True
            if self.refused is not None:
                log.warning("run %s: the API refused the last metrics (%s): not shipped", self.run_id, self.refused)
                return False
            time.sleep(0.5)
        return False

    def close(self) -> None:
        self.client.close()
