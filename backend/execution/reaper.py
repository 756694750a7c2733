"""Background duties of the API: mark runs whose heartbeat stopped as `lost`, re-send queued runs whose
message may be gone (broker flushed or restarted), and raise the `stalled` alert of running runs with no step for
their `run.stall_after_s` (backend/alerts/service.py), and delete browser-session tokens that were signed out or
expired (backend/auth/service.purge_sessions). All are safe to repeat: the worker's claim in the
database lets only one delivery start a run, and a run has one alert of each kind."""
from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta

from sqlalchemy import select

from backend.alerts import service as alerts
from backend.auth.service import purge_sessions
from backend.core.db import session_scope
from backend.core.instruments import RUNS_REAPED, RUNS_RESENT
from backend.core.settings import Settings
from backend.executors import registry as executors
from backend.runs import transitions
from backend.runs.models import Run
from backend.runs.service import enqueue
from backend.runs.states import ACTIVE, RunState

log = logging.getLogger(__name__)


def reap_lost(lost_after_s: float, listening_since: datetime | None = None) -> list[int]:
    """Active runs with no heartbeat for `lost_after_s` become `lost`; those with retries left are queued
    again as their next attempt (resumed from the last checkpoint). Answers the ids marked lost. Workers beat
    through the API (backend/execution/router.py), so a silence counts only while this API has listened: not
    until `listening_since` (its start) is `lost_after_s` ago, or a run would be lost for the API's own downtime."""
    cutoff = transitions.now() - timedelta(seconds=lost_after_s)
    if listening_since is not None and listening_since > cutoff:
        return []
    active = [st.value for st in ACTIVE]
    lost, retried = [], []
    with session_scope() as s:
        # only the executors that beat a heartbeat (Slurm knows whether a job lives: backend/executors/registry.py)
        for run in s.scalars(select(Run).where(Run.state.in_(active), Run.heartbeat_at < cutoff,
                                               Run.executor.in_(executors.reaped()))
                             .with_for_update(skip_locked=True)):
            transitions.mark_lost(s, run, f"no heartbeat from worker {run.worker} for {lost_after_s:.0f} s")
            lost.append(run.id)
            if run.attempt - 1 < run.max_retries:
                transitions.queue_retry(run)
                retried.append(run)
    for run in retried:
        enqueue(run)
    for run_id in lost:
        log.warning("run %s marked lost: its worker stopped sending heartbeats", run_id)
    RUNS_REAPED.inc(len(lost))
    return lost


def resend_wait_s(run: Run, resend_after_s: float) -> float:
    """How long after its last send a queued run is sent again: `resend_after_s`, then as long as it has already
    waited since it was queued (the wait doubles), so a run no worker can take yet (its GPU type has none up, or
    they are all busy) adds a message to the broker only now and then."""
    if run.sent_at is None or run.queued_at is None:
        return 0.0
    return max(resend_after_s, (transitions.as_utc(run.sent_at) - transitions.as_utc(run.queued_at)).total_seconds())


def resend_queued(resend_after_s: float | None = None) -> list[int]:
    """Send queued runs' messages again: all of them (at start-up: after a broker restart nothing queued is lost),
    or those unclaimed for longer than their wait (`resend_wait_s`; a flushed broker without an API restart)."""
    at = transitions.now()
    with session_scope() as s:
        runs = []
        for run in s.scalars(select(Run).where(Run.state == RunState.QUEUED.value).order_by(Run.id)
                             .with_for_update(skip_locked=True)):
            if resend_after_s is not None and run.sent_at is not None and \
                    (at - transitions.as_utc(run.sent_at)).total_seconds() < resend_wait_s(run, resend_after_s):
                continue
            run.queued_at, run.sent_at = run.queued_at or at, at
            runs.append(run)
    for run in runs:  # after the commit, as on approval
        enqueue(run)
    RUNS_RESENT.inc(len(runs))
    return [r.id for r in runs]


def purge_expired_sessions() -> int:
    with session_scope() as s:
        return purge_sessions(s)


def raise_stalls() -> list[int]:
    """Raise (and act on) the `stalled` alert of running runs whose steps stopped; answers their ids."""
    with session_scope() as s:
        return [a.run_id for a in alerts.check_stalls(s)]


async def supervise_forever(settings: Settings, interval_s: float = 5.0) -> None:
    listening_since = transitions.now()
    ids = await asyncio.to_thread(resend_queued)
    if ids:
        log.info("re-sent %d queued runs on start-up: %s", len(ids), ids)
    interval_s = max(0.5, min(interval_s, settings.resend_after_s))  # a short re-send wait needs short rounds
    while True:
        try:
            await asyncio.to_thread(reap_lost, settings.lost_after_s, listening_since)
            for run_id in await asyncio.to_thread(raise_stalls):
                log.warning("run %s: no step for its run.stall_after_s (alert raised)", run_id)
            await asyncio.to_thread(purge_expired_sessions)  # browser sessions signed out or past their cookie
            ids = await asyncio.to_thread(resend_queued, settings.resend_after_s)
            if ids:
                log.warning("re-sent queued runs no worker claimed within ULAB_RESEND_AFTER_S: %s", ids)
        except Exception:  # the database may be briefly away; try again next round
            log.exception("supervision round failed")
        await asyncio.sleep(interval_s)
