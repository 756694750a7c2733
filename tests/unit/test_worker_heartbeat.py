"""The worker's heartbeat runs in its own thread: a watch loop blocked on the API (metric shipping, the drain
after the trainer exits) must not starve it, a failing beat must not end it, and a stop request reaches the
loop."""
import threading
import time

from worker.supervise import Heartbeat


def test_beats_while_the_caller_is_blocked():
    beats = []
    with Heartbeat(lambda: beats.append(time.monotonic()) or False, every_s=0.05):
        time.sleep(0.6)  # the watch loop stuck in a slow POST
    assert len(beats) >= 6
    gaps = [b - a for a, b in zip(beats, beats[1:])]
    assert max(gaps) < 0.3


def test_a_failing_beat_is_retried_and_a_stop_request_is_kept():
    calls = []

    def beat():
        calls.append(1)
        if len(calls) <= 2:
            raise ConnectionError("database away")
        return len(calls) >= 4  # then the run is cancelled

    with Heartbeat(beat, every_s=0.02) as hb:
        assert hb.stop_requested.wait(2.0)
    assert len(calls) >= 4


def test_the_thread_ends_with_the_block():
    with Heartbeat(lambda: False, every_s=10.0) as hb:
        pass
    assert not hb._thread.is_alive()
    assert not any(t.name == "heartbeat" and t.is_alive() for t in threading.enumerate())


def test_a_last_beat_after_the_block_reports_the_last_step_shipped():
    """The drain ships the trainer's last steps after the thread's last round (a Slurm run showed 26 of its 30
    steps once succeeded): the beat made on leaving the block reports them."""
    shipped = {"step": 0}
    beats: list[int] = []
    with Heartbeat(lambda: beats.append(shipped["step"]) or False, every_s=10.0):
        time.sleep(0.05)  # the thread's first round
        shipped["step"] = 30  # the drain, well within one heartbeat interval
    assert beats[-1] == 30, beats


def test_a_stop_waits_for_the_plans_checkpoint_grace_before_sigkill():
    from types import SimpleNamespace

    from tests.tiny import tiny_plan
    from worker.supervise import stop_wait_s

    settings = SimpleNamespace(cancel_grace_s=10.0)
    plan = tiny_plan() | {"run": {"data": {"path": "d.txt"}, "stop_grace_s": 600.0}}
    assert stop_wait_s(plan, settings) == 610.0  # the plan's grace (torchrun's too), then the worker's margin
    assert stop_wait_s(tiny_plan(), settings) == 40.0  # a tiny model's ZeRO-3 save: torchrun's 30 s floor
    assert stop_wait_s({"not": "a plan"}, settings) == 10.0
