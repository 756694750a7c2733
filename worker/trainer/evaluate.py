"""Long-context evaluation inside a run: loss by token position, and passkey (needle-in-a-haystack) tests.

Both run on every rank in lockstep, through the model as it trains: under Ulysses each rank feeds its contiguous
1/sp shard of the sequence (as DeepSpeed's UlyssesSPDataLoaderAdapter shards a training batch), the attention's
all-to-all runs as in training, and ZeRO-3 gathers the parameters for the forward. The model is in eval mode, and
Accelerate registers Ulysses with `disable_in_eval=True` (each rank would then attend only within its own shard,
ulysses_sp.py `if not module.training and self.disable_in_eval`): `sp_attention_in_eval` keeps it on, sized for
one row, for the duration. Every data-parallel group
scores the same rows, so sums and counts reduced over the world keep the means exact. Logits are made a tile of
the shard at a time (TILE_BYTES of fp32 logits at most), so a 1M-token context never holds a [S, vocab] tensor.

Loss by position: the held-back rows of the stage (`run.eval_rows`, the last rows of its packed data, never
trained on) scored per token and averaged in log2-spaced buckets of the position of the predicting token inside
its document (position_ids: the context it has seen), e.g. [0,1) [1,2) [2,4) ... [S/2,S). A model that uses its
long context has a loss that keeps falling with the position.

Passkey: a five-digit key inside a filler text at a given depth and context length, then a question; the score is
the share of the key's tokens the model predicts (argmax, teacher-forced) after "The pass key is". One forward
per cell and trial, no generation loop.

Records (rank 0 writes them to the metrics file; the shipper stores each number as a metric point at the step):
  {"step": s, "eval": "position_loss", "stage": i, "eval_loss": L, "pos_loss@<hi>": loss of bucket [lo, hi), ...}
  {"step": s, "eval": "passkey", "stage": i, "passkey@<length>@<depth %>": score, ...}
"""
from __future__ import annotations

import contextlib
import random

import numpy as np
import torch

TILE_BYTES = 256 * 1024**2  # fp32 logits of one tile
FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ")
QUESTION = " What is the pass key? The pass key is "


def bucket_edges(seq_len: int) -> list[int]:
    """0, 1, 2, 4, ... up to seq_len: the log2-spaced position buckets [edges[k], edges[k+1])."""
    edges = [0, 1]
    while edges[-1] < seq_len:
        edges.append(min(edges[-1] * 2, seq_len))
    return edges


def _parts(model):
    """(decoder, lm_head) of a causal LM; a TiledLossHead's plain head."""
    head = model.get_output_embeddings()
    return model.get_decoder(), getattr(head, "head", head)


def _sp():
    """(sp size, this rank's index in its SP group)."""
    from deepspeed.utils import groups

    try:
        return groups._get_sequence_parallel_world_size(), groups._get_sequence_parallel_rank()
    except Exception:  # no SP groups (sp_size 1)
        return 1, 0


def _ulysses(model):
    """The UlyssesSPAttentionHF that DeepSpeed registered in place of the model's attention function (its wrapper
    closes over it), or None without SP."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    name = getattr(model.config, "_attn_implementation", None)
    fn = ALL_ATTENTION_FUNCTIONS[name] if name in ALL_ATTENTION_FUNCTIONS else None
    for cell in getattr(fn, "__closure__", None) or ():
        if isinstance(cell.cell_contents, UlyssesSPAttentionHF):
            return cell.cell_contents
    return None


@contextlib.contextmanager
def sp_attention_in_eval(model, batch_size: int = 1):
    """Ulysses attention on while the model is in eval mode, for micro batches of `batch_size` rows (it checks the
    shapes against the training micro batch size); everything restored on exit."""
    u = _ulysses(model) if _sp()[0] > 1 else None
    if u is None:
        yield
        return
    names = ("disable_in_eval", "batch_size", "required_query_shape", "required_key_value_shape",
             "required_context_shape")
    saved = {k: getattr(u, k) for k in names}
    u.disable_in_eval, u.batch_size = False, batch_size
    for k in names[2:]:  # [seq, batch, ...]; the sequence dimension follows each call (seq_length_is_variable)
        shape = getattr(u, k)
        setattr(u, k, torch.Size([shape[0], batch_size, *shape[2:]]))
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(u, k, v)


def _token_losses(model, input_ids: np.ndarray, position_ids: np.ndarray, labels: np.ndarray, device):
    """Per-token (loss, argmax, target, position) of this rank's shard of one row, targets only."""
    sp, sp_rank = _sp()
    shift = np.concatenate([labels[1:], [-100]])  # as the SP adapter shifts before sharding
    n = len(input_ids) // sp
    part = slice(sp_rank * n, (sp_rank + 1) * n)
    ids = torch.as_tensor(input_ids[part], device=device).unsqueeze(0)
    pos = torch.as_tensor(position_ids[part], device=device).unsqueeze(0)
    target = torch.as_tensor(shift[part], device=device)
    decoder, head = _parts(model)
    hidden = decoder(input_ids=ids, position_ids=pos, use_cache=False).last_hidden_state[0]
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    tile = max(1, TILE_BYTES // (4 * int(config.vocab_size)))  # the head's weight may be a ZeRO-3 partition
    losses, preds = [], []
    for t in range(0, hidden.shape[0], tile):
        logits = head(hidden[t:t + tile]).float()
        losses.append(torch.nn.functional.cross_entropy(logits, target[t:t + tile], ignore_index=-100,
                                                        reduction="none"))
        preds.append(logits.argmax(-1))
    keep = target != -100
    return torch.cat(losses)[keep], torch.cat(preds)[keep], target[keep], pos[0][keep]


def _all_reduce(t: torch.Tensor) -> torch.Tensor:
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(t)
    return t


def position_loss(model, rows: dict[str, np.ndarray], seq_len: int, device) -> dict:
    """The loss per position bucket over the rows (every rank calls it with the same rows)."""
    edges = bucket_edges(seq_len)
    sums = torch.zeros(len(edges) - 1, dtype=torch.float64, device=device)
    counts = torch.zeros_like(sums)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), sp_attention_in_eval(model):
            for r in range(rows["input_ids"].shape[0]):
                loss, _, _, pos = _token_losses(model, rows["input_ids"][r], rows["position_ids"][r],
                                                rows["labels"][r], device)
                bucket = torch.bucketize(pos, torch.as_tensor(edges[1:], device=device), right=True)
                sums.index_add_(0, bucket, loss.double())
                counts.index_add_(0, bucket, torch.ones_like(loss, dtype=torch.float64))
    finally:
        model.train(was_training)
    loss_sums: list[float] = _all_reduce(sums).cpu().tolist()
    token_counts: list[float] = _all_reduce(counts).cpu().tolist()
    record: dict = {"eval": "position_loss", "eval_loss": sum(loss_sums) / max(1.0, sum(token_counts))}
    for k in range(len(edges) - 1):
        if token_counts[k] > 0:
            record[f"pos_loss@{edges[k + 1]}"] = loss_sums[k] / token_counts[k]
    return record


def passkey_row(tok, length: int, depth: float, key: int) -> dict[str, np.ndarray]:
    """One passkey prompt of exactly `length` tokens: filler with the key's sentence at `depth`, the question and
    the key as the answer (the only targets)."""
    needle = tok.encode(f" The pass key is {key}. Remember it. ")
    question, answer = tok.encode(QUESTION), tok.encode(str(key))
    room = length - len(needle) - len(question) - len(answer)
    if room < 0:
        raise ValueError(f"passkey: {length} tokens cannot hold the key, the question and the answer")
    unit = tok.encode(FILLER)
    filler = (unit * (room // max(1, len(unit)) + 1))[:room]
    at = round(depth * room)
    ids = filler[:at] + needle + filler[at:] + question + answer
    labels = [-100] * (length - len(answer)) + answer
    return {"input_ids": np.asarray(ids, dtype=np.int64), "position_ids": np.arange(length, dtype=np.int64),
            "labels": np.asarray(labels, dtype=np.int64)}


def passkey(model, tok, lengths: list[int], depths: list[float], trials: int, seed: int, device) -> dict:
    """The share of the key's tokens predicted, per (length, depth), averaged over `trials` keys."""
    rng = random.Random(seed)  # the same keys on every rank
    cells = [(n, d) for n in lengths for d in depths]
    scores = torch.zeros(len(cells), dtype=torch.float64, device=device)
    totals = torch.zeros_like(scores)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), sp_attention_in_eval(model):
            for c, (n, d) in enumerate(cells):
                for _ in range(trials):
                    row = passkey_row(tok, n, d, rng.randrange(10_000, 100_000))
                    _, pred, target, _ = _token_losses(model, row["input_ids"], row["position_ids"], row["labels"],
                                                       device)
                    scores[c] += (pred == target).double().sum()
                    totals[c] += target.numel()
    finally:
        model.train(was_training)
    hits: list[float] = _all_reduce(scores).cpu().tolist()
    keys: list[float] = _all_reduce(totals).cpu().tolist()
    record: dict = {"eval": "passkey"}
    for c, (n, d) in enumerate(cells):
        record[f"passkey@{n}@{round(100 * d)}"] = hits[c] / max(1.0, keys[c])
    return record
