"""Background duties of the API: mark runs whose heartbeat stopped as `lost`, and re-send queued runs whose
message may be gone (broker flushed or restarted). Both are safe to repeat: the worker's claim in the
database lets only one delivery start a run."""
from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from sqlalchemy import select

from backend.core.db import session_scope
from backend.core.settings import Settings
from backend.runs.attempts import record_attempt
from backend.runs.models import Run
from backend.runs.service import enqueue, now, queue_retry
from backend.runs.states import ACTIVE, RunState

log = logging.getLogger(__name__)


def reap_lost(lost_after_s: float) -> list[int]:
    """Active runs with no heartbeat for `lost_after_s` become `lost`; those with retries left are queued
    again as their next attempt (resumed from the last checkpoint). Answers the ids marked lost."""
    cutoff = now() - timedelta(seconds=lost_after_s)
    active = [st.value for st in ACTIVE]
    lost, retried = [], []
    with session_scope() as s:
        for run in s.scalars(select(Run).where(Run.state.in_(active), Run.heartbeat_at < cutoff)
                             .with_for_update(skip_locked=True)):
            run.state, run.finished_at = RunState.LOST.value, now()
            run.exit_reason = f"no heartbeat from worker {run.worker} for {lost_after_s:.0f} s"
            record_attempt(s, run)
            lost.append(run.id)
            if run.attempt - 1 < run.max_retries:
                queue_retry(run)
                retried.append(run)
    for run in retried:
        enqueue(run)
    for run_id in lost:
        log.warning("run %s marked lost: its worker stopped sending heartbeats", run_id)
    return lost


def resend_queued() -> list[int]:
    """Send every queued run's message again (after a broker restart nothing queued is lost)."""
    with session_scope() as s:
        runs = list(s.scalars(select(Run).where(Run.state == RunState.QUEUED.value).order_by(Run.id)))
    for run in runs:
        enqueue(run)
    return [r.id for r in runs]


async def supervise_forever(settings: Settings, interval_s: float = 5.0) -> None:
    ids = await asyncio.to_thread(resend_queued)
    if ids:
        log.info("re-sent %d queued runs on start-up: %s", len(ids), ids)
    while True:
        try:
            await asyncio.to_thread(reap_lost, settings.lost_after_s)
        except Exception:  # the database may be briefly away; try again next round
            log.exception("reaper round failed")
        await asyncio.sleep(interval_s)
