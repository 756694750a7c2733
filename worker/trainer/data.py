"""Training data: read documents, tokenize, pack into seq_len rows with per-document position_ids.

- Sources: a text file (documents separated by blank lines, or one per line with `data.split: "line"`), JSONL
  (`data.text_field`, default "text"), Parquet, or a `datasets` dataset saved with `save_to_disk`.
- Tokenizer: the model's (`AutoTokenizer.from_pretrained(model_path)`), or a byte-level one for `model_path: null`.
- Packing: documents (each followed by EOS) are concatenated and cut into rows of seq_len tokens.
  `position_ids` restart at 0 at every document start and at every row start, so sdpa/flash attention see the
  document boundaries; the label of a document's first token is -100, so no token is trained to predict the
  next document across a boundary. A last partial row is padded (labels -100) to seq_len, which is a multiple
  of sp_size (the plan is refused otherwise).
- Packed rows are written once per stage to RUN_DIR/data/*.npz (the CLI does it before any rank starts; ranks
  reuse it), so every rank sees the same rows.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np

BYTE_EOS, BYTE_PAD, BYTE_VOCAB = 257, 258, 259


class DataError(ValueError):
    """Data the trainer cannot use; the message says which file and why."""


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255; EOS 257, PAD 258. Nothing to download."""

    name = "byte-level"
    eos_token_id = BYTE_EOS
    pad_token_id = BYTE_PAD

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


class HFTokenizer:
    def __init__(self, path: str):
        from transformers import AutoTokenizer

        try:
            self.tok = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError, TypeError) as e:  # no tokenizer files, or none Transformers can build
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise DataError(f"run.model_path: {path} has no tokenizer that loads ({first})") from None
        self.name = f"hf:{path}"
        self.eos_token_id = self.tok.eos_token_id
        self.pad_token_id = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.tok.eos_token_id

    def encode(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]


def tokenizer_for(model_path: str | None) -> ByteTokenizer | HFTokenizer:
    return ByteTokenizer() if model_path is None else HFTokenizer(model_path)


def resolve_data_path(data: dict, base_dir: Path | None) -> Path:
    p = Path(data["path"]).expanduser()
    if not p.is_absolute() and base_dir is not None and not p.exists() and (base_dir / p).exists():
        p = base_dir / p
    return p


def read_documents(path: Path, data: dict) -> list[str]:
    """The documents of a source, in order; DataError when missing or empty."""
    if not path.exists():
        raise DataError(f"run.data.path: {path} does not exist")
    field = data.get("text_field", "text")
    if path.is_dir():
        docs = _read_saved_dataset(path, field)
    elif path.stat().st_size == 0:
        raise DataError(f"run.data.path: {path} is empty")
    elif path.suffix in (".jsonl", ".json"):
        docs = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"run.data.path: {path} line {n} is not JSON: {e}") from None
            if not isinstance(row, dict) or not isinstance(row.get(field), str):
                raise DataError(f"run.data.text_field: {path} line {n} has no string field {field!r}")
            docs.append(row[field])
    elif path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise DataError(f"run.data.path: {path}: reading Parquet needs pyarrow, which is not installed") from None
        table = pq.read_table(path)
        if field not in table.column_names:
            raise DataError(f"run.data.text_field: {path} has no column {field!r} (columns: {table.column_names})")
        docs = [d for d in table.column(field).to_pylist() if d]
    else:
        text = path.read_text(encoding="utf-8", errors="replace")
        if data.get("split", "blank_line") == "line":
            docs = text.splitlines()
        else:
            docs = re.split(r"\n\s*\n", text)
    docs = [d for d in docs if d and d.strip()]
    if not docs:
        raise DataError(f"run.data.path: {path} is empty (no text in it)")
    return docs


def _read_saved_dataset(path: Path, field: str) -> list[str]:
    """A dataset saved with `datasets`' `save_to_disk` (a Dataset, or a DatasetDict whose "train" split is used),
    read with `datasets` when installed, else straight from its Arrow files (state.json lists them)."""
    try:
        from datasets import load_from_disk
    except ImportError:
        load_from_disk = None
    if load_from_disk is not None:
        try:
            ds = load_from_disk(str(path))
        except Exception as e:  # any failure here is the user's data
            raise DataError(f"run.data.path: {path} is not a dataset saved with save_to_disk: {e}") from None
        if hasattr(ds, "keys") and "train" in ds:
            ds = ds["train"]
        if field not in ds.column_names:
            raise DataError(f"run.data.text_field: {path} has no column {field!r} (columns: {ds.column_names})")
        return [d for d in ds[field] if d]
    try:
        import pyarrow as pa
    except ImportError:
        raise DataError(f"run.data.path: {path} is a directory; reading a saved dataset needs pyarrow") from None
    if (path / "dataset_dict.json").exists():
        splits = json.loads((path / "dataset_dict.json").read_text()).get("splits") or []
        if not splits:
            raise DataError(f"run.data.path: {path} is a DatasetDict without splits")
        path = path / ("train" if "train" in splits else splits[0])
    state = path / "state.json"
    if not state.exists():
        raise DataError(f"run.data.path: {path} is a directory but not a dataset saved with save_to_disk "
                        "(no state.json)")
    docs: list[str] = []
    for f in json.loads(state.read_text()).get("_data_files", []):
        with pa.memory_map(str(path / f["filename"])) as src:
            table = pa.ipc.open_stream(src).read_all()
        if field not in table.column_names:
            raise DataError(f"run.data.text_field: {path} has no column {field!r} (columns: {table.column_names})")
        docs.extend(d for d in table.column(field).to_pylist() if d)
    return docs


def pack_documents(docs_ids: list[list[int]], seq_len: int, eos_id: int, pad_id: int) -> dict[str, np.ndarray]:
    """Rows of seq_len: input_ids, position_ids (restart per document and per row), labels (-100 at document
    starts and on padding). Returns int64 arrays of shape [rows, seq_len]."""
    flat_ids: list[int] = []
    flat_pos: list[int] = []
    flat_starts: list[int] = []
    for doc in docs_ids:
        toks = list(doc) + [eos_id]
        flat_ids.extend(toks)
        flat_pos.extend(range(len(toks)))
        flat_starts.extend([1] + [0] * (len(toks) - 1))
    ids = np.asarray(flat_ids, dtype=np.int64)
    pos = np.asarray(flat_pos, dtype=np.int64)
    starts = np.asarray(flat_starts, dtype=bool)
    n = len(ids)
    rows = -(-n // seq_len)
    pad = rows * seq_len - n
    labels = np.where(starts, -100, ids)
    if pad:
        last_pos = pos[-1]
        ids = np.concatenate([ids, np.full(pad, pad_id, dtype=np.int64)])
        labels = np.concatenate([labels, np.full(pad, -100, dtype=np.int64)])
        pos = np.concatenate([pos, last_pos + 1 + np.arange(pad, dtype=np.int64)])
        starts = np.concatenate([starts, np.zeros(pad, dtype=bool)])
    ids, pos, labels, starts = (a.reshape(rows, seq_len) for a in (ids, pos, labels, starts))
    # a document cut by a row boundary goes on as a new document in the next row: its positions restart at 0
    pos = pos.copy()
    for r in range(rows):
        first = np.flatnonzero(starts[r])
        head = int(first[0]) if len(first) else seq_len
        pos[r, :head] = np.arange(head)
    labels = labels.copy()
    labels[:, 0] = -100  # a row's first token is nobody's target (kept explicit: position 0 is never a target)
    return {"input_ids": ids, "position_ids": pos, "labels": labels}


def step_row(i: int, *, sp: int, dp: int, grad_accum: int, micro_batch: int) -> int:
    """The row, counted from the first step a dataset starts at, that the sampler's i-th sample must be, so that
    optimizer step s trains rows s*P .. s*P+P-1 (P = micro_batch * grad_accum * dp) whatever the layout: the rows
    one process with the same P trains, and a resume after any step starts at the next unseen row.

    The path of sample i to a step: Accelerate deals the sampler's batches (of micro_batch samples) round-robin
    over all sp*dp ranks (batch B to rank B % world, its (B // world)-th); DeepSpeed's SP groups are consecutive
    ranks (d*sp .. d*sp+sp-1, parallel_state_sp.py); UlyssesSPDataLoaderAdapter makes the group's k-th micro
    batch from member k % sp's (k // sp)-th batch (ulysses_sp.py); the Trainer takes grad_accum micro batches per
    step. Without SP (sp = 1) every rank is its own group."""
    world = sp * dp
    batch, e = divmod(i, micro_batch)
    b, rank = divmod(batch, world)
    group, member = divmod(rank, sp)
    step, m = divmod(b * sp + member, grad_accum)
    return step * (micro_batch * grad_accum * dp) + (group * grad_accum + m) * micro_batch + e


def _cache_key(spec, path: Path, seq_len: int, tok_name: str) -> str:
    st = path.stat()
    h = hashlib.sha256(json.dumps(["pack-v2", str(path.resolve()), st.st_size, st.st_mtime_ns, seq_len, tok_name,
                                   spec.data.get("text_field", "text"), spec.data.get("split", "blank_line")]).encode())
    return h.hexdigest()[:16]


def stage_data_path(run_dir: Path, stage_index: int) -> Path:
    return Path(run_dir) / "data" / f"stage{stage_index}.npz"


def prepare_all_stages(spec, run_dir: Path, base_dir: Path | None = None) -> list[Path]:
    """Tokenize once and write one packed file per stage; reuses files whose source has not changed."""
    path = resolve_data_path(spec.data, base_dir)
    if not path.exists():
        raise DataError(f"run.data.path: {path} does not exist")
    loaded: tuple[ByteTokenizer | HFTokenizer, list[list[int]]] | None = None  # read and tokenized once, if needed
    out = []
    for i, stage in enumerate(spec.stages):
        target = stage_data_path(run_dir, i)
        tokenizer_name = "byte-level" if spec.tokenizer_path is None else f"hf:{spec.tokenizer_path}"
        key = _cache_key(spec, path, stage.seq_len, tokenizer_name)
        meta = target.with_suffix(".json")
        if target.exists() and meta.exists() and json.loads(meta.read_text()).get("key") == key:
            _check_held_back(spec, path, stage.seq_len, json.loads(meta.read_text())["rows"])
            out.append(target)
            continue
        if loaded is None:
            docs = read_documents(path, spec.data)
            tokenizer = tokenizer_for(spec.tokenizer_path)
            loaded = tokenizer, [tokenizer.encode(d) for d in docs]
        tok, docs_ids = loaded
        total = sum(len(d) + 1 for d in docs_ids)
        if total < stage.seq_len:
            raise DataError(f"run.data.path: {path} holds {total} tokens, too short for one sequence of "
                            f"seq_len {stage.seq_len}")
        packed = pack_documents(docs_ids, stage.seq_len, tok.eos_token_id, tok.pad_token_id)
        _check_held_back(spec, path, stage.seq_len, int(packed["input_ids"].shape[0]))
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.stem}.{os.getpid()}.npz")
        np.savez(tmp, input_ids=packed["input_ids"], position_ids=packed["position_ids"], labels=packed["labels"])
        os.replace(tmp, target)
        meta_tmp = meta.with_name(f".{meta.name}.{os.getpid()}")
        meta_tmp.write_text(json.dumps({"key": key, "rows": int(packed["input_ids"].shape[0]),
                                        "seq_len": stage.seq_len, "tokens": int(total), "tokenizer": tok.name}))
        os.replace(meta_tmp, meta)
        out.append(target)
    return out


def _check_held_back(spec, path: Path, seq_len: int, rows: int) -> None:
    held = spec.run.eval_rows
    if held and rows <= held:
        raise DataError(f"run.eval_rows: {held} rows held back for evaluation leave none to train on: {path} packs "
                        f"into {rows} rows of seq_len {seq_len}")


def load_stage_rows(run_dir: Path, stage_index: int) -> dict[str, np.ndarray]:
    with np.load(stage_data_path(run_dir, stage_index)) as z:
        return {k: z[k] for k in z.files}


def hold_back(rows: dict[str, np.ndarray], n: int, padded_last: bool) -> tuple[dict, dict | None]:
    """(training rows, evaluation rows): the last n complete rows are held back, never trained on. A last row that
    packing padded (`padded_last`: the stage's tokens do not fill its rows) stays with the training rows: its targets
    sit in its first part only, so under Ulysses they would all fall in the first shard and an evaluation on it
    could not see whether attention crosses the shards."""
    if not n:
        return rows, None
    total = next(iter(rows.values())).shape[0]
    end = total - 1 if padded_last and total > n + 1 else total
    keep = np.r_[0:end - n, end:total]
    return {k: v[keep] for k, v in rows.items()}, {k: v[end - n:end] for k, v in rows.items()}


def last_row_padded(run_dir: Path, stage_index: int) -> bool:
    meta = json.loads(stage_data_path(run_dir, stage_index).with_suffix(".json").read_text())
    return int(meta["tokens"]) < int(meta["rows"]) * int(meta["seq_len"])
