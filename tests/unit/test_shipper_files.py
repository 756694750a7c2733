"""The shipper reads an attempt's metrics file by identity, not by name and offset: a file replaced or
truncated under it is read again from its start, a torn last line waits for its end, and the files before the
newest start from scratch are superseded."""
from __future__ import annotations

import json

from worker.shipper import MetricShipper
from worker.trainer.attempt import current_files, first_step, metrics_file


def lines(*steps: int, attempt: int = 1) -> str:
    return "".join(json.dumps({"step": s, "loss": float(attempt), "attempt_marker": attempt}) + "\n" for s in steps)


def steps_of(raw: list[str]) -> list[int]:
    return [json.loads(x)["step"] for x in raw]


def test_a_replaced_or_truncated_file_is_read_again_from_its_start(tmp_path):
    shipper = MetricShipper(tmp_path, "http://127.0.0.1:9", 1, "t")
    path = metrics_file(tmp_path, 1)
    path.write_text(lines(1, 2, 3, 4, 5, 6))
    raw, shipper.offsets[path] = shipper._read_new_lines(path)
    assert steps_of(raw) == [1, 2, 3, 4, 5, 6]
    path.unlink()  # deleted and written anew, longer than before: the old offset would land mid-line
    path.write_text(lines(1, 2, 3, 4, 5, 6, 7, 8, 9, attempt=2))
    raw, shipper.offsets[path] = shipper._read_new_lines(path)
    assert steps_of(raw) == list(range(1, 10)), "lines of the new file were skipped"
    path.write_text(lines(1, 2, attempt=3))  # truncated in place (same inode): shorter than the offset
    raw, shipper.offsets[path] = shipper._read_new_lines(path)
    assert steps_of(raw) == [1, 2]
    with path.open("a") as f:  # a torn last line waits for its end
        f.write('{"step": 3, "lo')
    raw, shipper.offsets[path] = shipper._read_new_lines(path)
    assert raw == []
    with path.open("a") as f:
        f.write('ss": 1.0}\n')
    raw, _ = shipper._read_new_lines(path)
    assert steps_of(raw) == [3]
    shipper.close()


def test_files_before_the_newest_start_from_scratch_are_superseded(tmp_path):
    metrics_file(tmp_path, 1).write_text(lines(1, 2, 3, 4, 5))
    metrics_file(tmp_path, 2).write_text(lines(6, 7, attempt=2))  # resumed from step 5
    assert [p.name for p in current_files(tmp_path)] == ["metrics.jsonl", "metrics.attempt-2.jsonl"]
    metrics_file(tmp_path, 3).write_text(lines(1, 2, attempt=3))  # no checkpoint: from scratch
    metrics_file(tmp_path, 4).write_text(lines(3, attempt=4))
    assert [p.name for p in current_files(tmp_path)] == ["metrics.attempt-3.jsonl", "metrics.attempt-4.jsonl"]
    assert first_step(metrics_file(tmp_path, 4)) == 3


def test_each_batch_says_its_files_first_step_and_when_it_was_written(tmp_path):
    """The API's alerts leave out a file an earlier attempt began (backend/runs/alerts.earlier_attempts_file): each
    batch carries its file's first step and that step's wall time."""
    metrics_file(tmp_path, 1).write_text("".join(json.dumps({"step": s, "loss": 1.0, "time": 1000.0 + s}) + "\n"
                                                 for s in (1, 2)))
    metrics_file(tmp_path, 2).write_text("".join(json.dumps({"step": s, "loss": 1.0, "time": 2000.0 + s}) + "\n"
                                                 for s in (3, 4)))
    shipper = MetricShipper(tmp_path, "http://127.0.0.1:9", 1, "t")
    sent = []

    class Stored:
        def raise_for_status(self):
            return None

    def post(url, content, headers):
        sent.append(json.loads(content))
        return Stored()

    shipper.client.post = post
    assert shipper.ship()
    assert [(b["first_step"], b["file_started"], [p["step"] for p in b["points"]]) for b in sent] == [
        (1, 1001.0, [1, 2]), (3, 2003.0, [3, 4])]
    shipper.close()
