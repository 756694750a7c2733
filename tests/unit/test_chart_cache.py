"""The chart's answer cache (backend/metrics/chart.py AnswerCache): one computation for many askers of one key, a
run's answers forgotten at its ingest, and an answer computed across a forget not kept."""
from __future__ import annotations

import threading

from backend.metrics.chart import AnswerCache


def test_many_askers_of_one_key_wait_for_one_computation():
    cache = AnswerCache(max_bytes=1 << 20)
    computed, release = [], threading.Event()

    def compute() -> bytes:
        computed.append(1)
        release.wait(10)
        return b"answer"

    answers: list[bytes] = []
    threads = [threading.Thread(target=lambda: answers.append(cache.get((7, "loss"), 60, compute)))
               for _ in range(20)]
    for t in threads:
        t.start()
    release.set()
    for t in threads:
        t.join(10)
    assert answers == [b"answer"] * 20
    assert len(computed) == 1


def test_forget_drops_a_runs_answers_only():
    cache = AnswerCache(max_bytes=1 << 20)
    cache.get((7, "loss"), 60, lambda: b"old 7")
    cache.get((8, "loss"), 60, lambda: b"old 8")
    cache.forget(7)
    assert cache.get((7, "loss"), 60, lambda: b"new 7") == b"new 7"
    assert cache.get((8, "loss"), 60, lambda: b"new 8") == b"old 8"


def test_an_answer_computed_across_a_forget_is_not_kept():
    cache = AnswerCache(max_bytes=1 << 20)

    def compute_while_ingested() -> bytes:
        cache.forget(7)  # points of run 7 arrive while its chart is computed
        return b"before the points"

    assert cache.get((7, "loss"), 60, compute_while_ingested) == b"before the points"
    assert cache.get((7, "loss"), 60, lambda: b"with the points") == b"with the points"


def test_the_least_recently_used_go_past_the_byte_bound():
    cache = AnswerCache(max_bytes=10)
    cache.get((1, "a"), 60, lambda: b"12345")
    cache.get((2, "a"), 60, lambda: b"12345")
    cache.get((1, "a"), 60, lambda: b"fresh")  # a hit: (1, "a") is now the most recent
    cache.get((3, "a"), 60, lambda: b"12345")  # 15 bytes: (2, "a") goes
    assert cache.get((1, "a"), 60, lambda: b"recomputed") == b"12345"
    assert cache.get((2, "a"), 60, lambda: b"recomputed") == b"recomputed"


def test_a_ttl_of_zero_computes_every_time():
    cache = AnswerCache(max_bytes=1 << 20)
    assert cache.get((1, "a"), 0, lambda: b"one") == b"one"
    assert cache.get((1, "a"), 0, lambda: b"two") == b"two"


def test_while_one_asker_computes_anew_the_others_get_the_last_answer():
    cache = AnswerCache(max_bytes=1 << 20)
    cache.get((7, "loss"), 1e-9, lambda: b"last")  # expired at once
    started, release = threading.Event(), threading.Event()

    def slow() -> bytes:
        started.set()
        release.wait(10)
        return b"new"

    first: list[bytes] = []
    worker = threading.Thread(target=lambda: first.append(cache.get((7, "loss"), 60, slow)))
    worker.start()
    assert started.wait(10)
    assert cache.get((7, "loss"), 60, lambda: b"never") == b"last"  # no wait behind the computation
    release.set()
    worker.join(10)
    assert first == [b"new"]
    assert cache.get((7, "loss"), 60, lambda: b"never") == b"new"
