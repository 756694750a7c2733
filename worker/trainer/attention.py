"""Attention over packed documents without an S x S mask.

Packed rows hold several documents; `position_ids` restart at every document (data.py), and a token must attend
only to earlier tokens of its own document. Transformers' sdpa path turns packed position_ids into a
[batch, 1, S, S] boolean mask: O(S^2) memory (2.5e11 bytes at S = 500K), and a mask rules out the flash kernel.
Under Ulysses that mask is even built for each rank's shard and then thrown away. So the trainer installs:

- sdpa: `sdpa_by_document` runs the original sdpa once per document with `is_causal` (no mask; torch picks its
  flash or memory-efficient kernel on CUDA, the blocked CPU kernel on CPU); a row with one document is a single
  `is_causal` call. The mask builder for "sdpa" answers None, so Transformers never allocates one.
- flash_attention_2 / 3: Transformers already runs flash varlen from position_ids (cu_seqlens where they restart)
  but only at batch size 1 (`_is_packed_sequence`); `flash_flattened` flattens a micro batch of b rows into one
  row of b*S tokens, so documents stay apart at any micro batch size (every packed row starts at position 0).

Both are installed under the implementation's own name before Ulysses registers (DeepSpeed wraps whatever
ALL_ATTENTION_FUNCTIONS holds then), so the same code runs with and without sequence parallelism. Document starts
are found as Transformers finds them (`find_packed_sequence_indices`: position_ids not continuing by +1).
Models with a sliding window keep Transformers' masks (the window lives in the mask).
"""
from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

FLASH = ("flash_attention_2", "flash_attention_3")
# The wrappers this module made: installing is idempotent (a wrapper already in Transformers' table is not wrapped
# again).
_WRAPPERS: weakref.WeakSet[Callable[..., Any]] = weakref.WeakSet()


def _ours(fn: Callable[..., Any]) -> Callable[..., Any]:
    _WRAPPERS.add(fn)
    return fn


def document_spans(position_ids: torch.Tensor) -> list[list[tuple[int, int]]]:
    """[(start, end), ...] of the documents in each row of a [batch, S] position_ids tensor."""
    starts = torch.diff(position_ids, dim=-1) != 1  # True at i where token i + 1 starts a document
    out = []
    s = position_ids.shape[-1]
    for row in starts.cpu():
        begin = [0] + (torch.nonzero(row).flatten() + 1).tolist()
        out.append(list(zip(begin, begin[1:] + [s])))
    return out


class _SpanCache:
    """Without Ulysses every layer of a forward gets the same position_ids tensor: find its documents once (one
    device sync per forward, not per layer). Keyed by the tensor object itself (a weak reference), never by its
    address, which a later micro batch may reuse with other contents."""

    def __init__(self):
        self.ref = None
        self.version = -1
        self.spans: list[list[tuple[int, int]]] = []

    def __call__(self, pos: torch.Tensor) -> list[list[tuple[int, int]]]:
        if self.ref is None or self.ref() is not pos or self.version != pos._version:
            self.ref, self.version, self.spans = weakref.ref(pos), pos._version, document_spans(pos)
        return self.spans


def sdpa_by_document(inner):
    """Wrap Transformers' sdpa attention function: per-document `is_causal` calls instead of a mask."""
    spans_of = _SpanCache()

    def attention(module, query, key, value, attention_mask, *args, **kwargs):
        pos = kwargs.get("position_ids")
        if attention_mask is not None or pos is None or query.shape[2] <= 1 or pos.shape[-1] != query.shape[2]:
            return inner(module, query, key, value, attention_mask, *args, **kwargs)
        kwargs.pop("is_causal", None)  # causal within each document: the module's own flag (decoders: True)
        spans = spans_of(pos)
        if all(len(row) == 1 for row in spans):
            return inner(module, query, key, value, None, *args, **kwargs)
        rows = []
        for b, row in enumerate(spans):
            pieces = [inner(module, query[b:b + 1, :, a:e], key[b:b + 1, :, a:e], value[b:b + 1, :, a:e], None,
                            *args, **kwargs)[0] for a, e in row]
            rows.append(torch.cat(pieces, dim=1))  # [1, s, heads, head_dim]
        return torch.cat(rows, dim=0), None

    return _ours(attention)


def flash_flattened(inner):
    """Wrap Transformers' flash attention function: a micro batch of b packed rows runs as one row of b*S tokens,
    so flash varlen (cu_seqlens from position_ids) separates the documents."""

    def attention(module, query, key, value, attention_mask, *args, **kwargs):
        pos = kwargs.get("position_ids")
        b, s = query.shape[0], query.shape[2]
        if b == 1 or attention_mask is not None or pos is None or pos.shape[-1] != s:
            return inner(module, query, key, value, attention_mask, *args, **kwargs)

        def flat(x):  # [b, heads, s, d] -> [1, heads, b*s, d], row-major over (b, s)
            return x.transpose(0, 1).reshape(1, x.shape[1], b * s, x.shape[3])

        kwargs["position_ids"] = pos.reshape(1, b * s)
        out, weights = inner(module, flat(query), flat(key), flat(value), None, *args, **kwargs)
        return out.reshape(b, s, *out.shape[2:]), weights

    return _ours(attention)


def _no_sdpa_mask(original):
    def mask(*args, **kwargs):
        padding = kwargs.get("attention_mask")
        if padding is not None and not bool(padding.all()):  # real padding: keep Transformers' mask
            return original(*args, **kwargs)
        return None  # causal and document boundaries come from position_ids in sdpa_by_document

    return _ours(mask)


def has_sliding_window(config) -> bool:
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    layer_types = getattr(cfg, "layer_types", None) or []
    if "sliding_attention" in layer_types:
        return True
    return bool(getattr(cfg, "sliding_window", None)) and getattr(cfg, "use_sliding_window", True) is not False


def install_document_attention(attn: str, config=None) -> bool:
    """Install the wrappers for `attn` (idempotent). False (nothing installed) for kernels that need no help
    (flex_attention's BlockMask) or a sliding-window model."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if config is not None and has_sliding_window(config):
        return False
    if attn == "sdpa":
        if ALL_ATTENTION_FUNCTIONS["sdpa"] not in _WRAPPERS:
            ALL_ATTENTION_FUNCTIONS["sdpa"] = sdpa_by_document(ALL_ATTENTION_FUNCTIONS["sdpa"])
        if ALL_MASK_ATTENTION_FUNCTIONS["sdpa"] not in _WRAPPERS:
            ALL_MASK_ATTENTION_FUNCTIONS["sdpa"] = _no_sdpa_mask(ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
        return True
    if attn in FLASH:
        if ALL_ATTENTION_FUNCTIONS[attn] not in _WRAPPERS:
            ALL_ATTENTION_FUNCTIONS[attn] = flash_flattened(ALL_ATTENTION_FUNCTIONS[attn])
        return True
    return False
