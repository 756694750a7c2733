"""Data: reading sources, packing with per-document position_ids, boundary label masking, clear errors."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.tiny import tiny_plan
from worker.trainer.data import (
    BYTE_EOS,
    BYTE_PAD,
    ByteTokenizer,
    DataError,
    hold_back,
    pack_documents,
    prepare_all_stages,
    read_documents,
    step_row,
)
from worker.trainer.spec import RunSpec


def test_pack_restarts_positions_per_document_and_masks_boundary_labels():
    docs = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]  # with EOS: lengths 4, 3, 5 = 12 tokens
    p = pack_documents(docs, seq_len=6, eos_id=99, pad_id=0)
    assert p["input_ids"].tolist() == [[1, 2, 3, 99, 4, 5], [99, 6, 7, 8, 9, 99]]
    # doc 2 starts at row 0 col 4; its tail continues row 1 as a new document (positions restart at 0)
    assert p["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1], [0, 0, 1, 2, 3, 4]]
    # the first token of every document is never a target (no prediction across a boundary)
    assert p["labels"].tolist() == [[-100, 2, 3, 99, -100, 5], [-100, -100, 7, 8, 9, 99]]


def test_pack_pads_the_last_row_to_seq_len_with_masked_labels():
    p = pack_documents([[1, 2, 3, 4, 5]], seq_len=4, eos_id=9, pad_id=7)
    assert p["input_ids"].shape == (2, 4)
    assert p["input_ids"][1].tolist() == [5, 9, 7, 7]
    assert p["labels"][1].tolist() == [-100, 9, -100, -100]
    assert p["position_ids"][1].tolist() == [0, 1, 2, 3]


def test_the_evaluation_holds_back_the_last_complete_rows():
    """A padded last row has its targets in its first part only (under SP, all in the first shard): it stays with the
    training rows, and the rows before it are held back."""
    rows = {"input_ids": np.arange(5)[:, None] * np.ones((1, 4), dtype=np.int64)}
    train, held = hold_back(rows, 2, padded_last=True)
    assert held["input_ids"][:, 0].tolist() == [2, 3]
    assert train["input_ids"][:, 0].tolist() == [0, 1, 4]
    train, held = hold_back(rows, 2, padded_last=False)
    assert held["input_ids"][:, 0].tolist() == [3, 4]
    assert train["input_ids"][:, 0].tolist() == [0, 1, 2]
    assert hold_back(rows, 0, padded_last=True) == (rows, None)
    train, held = hold_back(rows, 4, padded_last=True)  # no complete row to spare: the padded one is held too
    assert held["input_ids"][:, 0].tolist() == [1, 2, 3, 4]
    assert train["input_ids"][:, 0].tolist() == [0]


def test_every_row_has_seq_len_and_labels_match_inputs_off_the_boundaries():
    rng = np.random.default_rng(0)
    docs = [list(rng.integers(0, 256, rng.integers(1, 50))) for _ in range(40)]
    p = pack_documents(docs, seq_len=64, eos_id=BYTE_EOS, pad_id=BYTE_PAD)
    ids, labels, pos = p["input_ids"], p["labels"], p["position_ids"]
    assert ids.shape[1] == 64
    assert labels.shape == ids.shape == pos.shape
    keep = labels != -100
    assert (labels[keep] == ids[keep]).all()
    assert keep.sum() > 0.8 * keep.size
    assert ((pos == 0) <= ~keep).all(), "a token at position 0 must not be a target"


def test_text_documents_split_on_blank_lines_or_lines(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("one\ntwo\n\nthree\n\n\nfour\n")
    assert read_documents(f, {}) == ["one\ntwo", "three", "four\n"]
    assert read_documents(f, {"split": "line"}) == ["one", "two", "three", "four"]


def test_jsonl_documents(tmp_path):
    f = tmp_path / "a.jsonl"
    f.write_text(json.dumps({"text": "hello"}) + "\n" + json.dumps({"text": "world"}) + "\n")
    assert read_documents(f, {}) == ["hello", "world"]
    f.write_text(json.dumps({"body": "x"}) + "\n")
    with pytest.raises(DataError, match="text_field"):
        read_documents(f, {})


@pytest.mark.parametrize("content,match", [(None, "does not exist"), ("", "is empty"), ("\n\n  \n", "is empty")])
def test_bad_sources_fail_with_a_clear_error(tmp_path, content, match):
    f = tmp_path / "d.txt"
    if content is not None:
        f.write_text(content)
    with pytest.raises(DataError, match=match):
        read_documents(f, {})


def _spec(tmp_path, data_path, seq_len=64):
    plan = {**tiny_plan(sp_size=2, seq_len=seq_len),
            "run": {"steps": 2, "data": {"path": str(data_path)}, "model_path": None}}
    return RunSpec.from_plan(plan)


def test_too_short_for_one_sequence(tmp_path):
    f = tmp_path / "short.txt"
    f.write_text("tiny")
    with pytest.raises(DataError, match="too short for one sequence"):
        prepare_all_stages(_spec(tmp_path, f, seq_len=64), tmp_path / "run")


def test_prepare_writes_rows_once_and_reuses_them(tmp_path):
    f = tmp_path / "d.txt"
    f.write_text("\n\n".join(f"document number {i} " * 5 for i in range(30)))
    spec = _spec(tmp_path, f)
    [path] = prepare_all_stages(spec, tmp_path / "run")
    mtime = path.stat().st_mtime_ns
    assert prepare_all_stages(spec, tmp_path / "run") == [path]
    assert path.stat().st_mtime_ns == mtime
    with np.load(path) as z:
        assert z["input_ids"].shape[1] == 64
        assert z["input_ids"].shape[1] % spec.sp_size == 0


def test_byte_tokenizer_round_trip():
    assert bytes(ByteTokenizer().encode("héllo")).decode() == "héllo"


def test_parquet_documents(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": ["first doc", "", "second doc"], "id": [1, 2, 3]}), f)
    assert read_documents(f, {}) == ["first doc", "second doc"]
    with pytest.raises(DataError, match="no column 'body'"):
        read_documents(f, {"text_field": "body"})


def _save_like_datasets(d, texts):
    """The layout `datasets.Dataset.save_to_disk` writes: Arrow IPC stream files listed in state.json."""
    import pyarrow as pa

    d.mkdir(parents=True)
    table = pa.table({"text": texts})
    with pa.OSFile(str(d / "data-00000-of-00001.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
    (d / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    (d / "dataset_info.json").write_text("{}")


def test_saved_dataset_directory_and_dataset_dict(tmp_path):
    _save_like_datasets(tmp_path / "ds", ["a b c", "d e"])
    assert read_documents(tmp_path / "ds", {}) == ["a b c", "d e"]
    _save_like_datasets(tmp_path / "dd" / "train", ["x", "y"])
    (tmp_path / "dd" / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    assert read_documents(tmp_path / "dd", {}) == ["x", "y"]
    (tmp_path / "plain").mkdir()
    with pytest.raises(DataError, match="not a dataset saved"):
        read_documents(tmp_path / "plain", {})


@pytest.mark.parametrize("sp,dp,gas,mbs", [(1, 1, 2, 1), (2, 1, 2, 1), (1, 2, 1, 1), (2, 2, 1, 1), (2, 2, 3, 1),
                                           (4, 2, 1, 2), (2, 3, 2, 2), (1, 4, 3, 2)])
def test_every_step_trains_the_next_consecutive_rows_whatever_the_layout(sp, dp, gas, mbs):
    """Deal the samples with Accelerate's own BatchSamplerShard (batch B to rank B % world), group the ranks as
    DeepSpeed does (consecutive sp ranks), feed each group's micro batches in UlyssesSPDataLoaderAdapter's order
    (member k % sp's (k // sp)-th batch) and take grad_accum per step: step s must train rows s*P .. s*P+P-1, as
    one process does, so any resume point (any step, odd or even) starts at the first row not yet trained."""
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler, SequentialSampler

    world, per_step, steps = sp * dp, mbs * gas * dp, 7
    n = -(-steps * per_step // (world * mbs)) * world * mbs  # the trainer's dataset length, in whole rounds
    batches = BatchSampler(SequentialSampler(range(n)), mbs, drop_last=False)
    dealt = [list(BatchSamplerShard(batches, num_processes=world, process_index=r)) for r in range(world)]
    layout = {"sp": sp, "dp": dp, "grad_accum": gas, "micro_batch": mbs}
    trained: dict[int, list[int]] = {}
    for group in range(dp):
        stream = [dealt[group * sp + k % sp][k // sp] for k in range(len(dealt[0]) * sp)]
        for k, micro in enumerate(stream[:steps * gas]):
            trained.setdefault(k // gas, []).extend(step_row(i, **layout) for i in micro)
    for s in range(steps):
        assert sorted(trained[s]) == list(range(s * per_step, (s + 1) * per_step)), (s, trained[s])


def test_a_steps_target_count_from_the_rows_is_what_its_samples_hold():
    """UlyssesTrainer counts N (the step's target tokens) from the rows instead of an all_reduce per step: for any
    layout, step k's count must be the targets of exactly the samples step_row sends to step k."""
    from worker.trainer.sp_trainer import PackedRows

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 50, size=(13, 16))
    labels[rng.random(labels.shape) < 0.3] = -100
    rows = {"input_ids": labels.clip(0), "position_ids": np.tile(np.arange(16), (13, 1)), "labels": labels}
    targets = (labels[:, 1:] != -100).sum(axis=1)
    for sp, dp, ga, mb in [(1, 1, 1, 1), (2, 1, 1, 1), (2, 2, 2, 1), (4, 1, 3, 2), (1, 3, 2, 2)]:
        per_step, steps, offset = mb * ga * dp, 5, 7
        ds = PackedRows(rows, offset=offset, length=steps * per_step, sp=sp, dp=dp, grad_accum=ga, micro_batch=mb)
        by_step = [0] * steps
        for i in range(len(ds)):
            r = step_row(i, sp=sp, dp=dp, grad_accum=ga, micro_batch=mb)
            by_step[r // per_step] += int(targets[(offset + r) % 13])
        assert [ds.step_targets(k) for k in range(steps)] == by_step, (sp, dp, ga, mb)
