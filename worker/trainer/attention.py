"""Attention over packed documents without an S x S mask.

Packed rows hold several documents; `position_ids` restart at every document (data.py), and a token must attend
only to earlier tokens of its own document. Transformers' sdpa path turns packed position_ids into a
[batch, 1, S, S] boolean mask: O(S^2) memory (2.5e11 bytes at S = 500K), and a mask rules out the flash kernel.
Under Ulysses that mask is even built for each rank's shard and then thrown away. So the trainer installs:

- sdpa: `sdpa_by_document` runs the original sdpa once per layer over all documents of the micro batch, each
  padded to one bucket length (`DocumentLayout`), with `is_causal` (no mask; torch picks its flash or
  memory-efficient kernel on CUDA, the blocked CPU kernel on CPU); a row with one document is a single `is_causal`
  call. The layout comes from the host-side batch (sp_trainer.collate_packed), so no layer reads position_ids back
  from the device. The mask builder for "sdpa" answers None, so Transformers never allocates one.
- flash_attention_2 / 3: Transformers runs flash varlen from position_ids (cu_seqlens where they restart) but only
  at batch size 1 (`_is_packed_sequence`), and finds them on the device in every layer (a read-back each);
  `flash_flattened` flattens a micro batch of b rows into one row of b*S tokens and hands flash varlen the
  layout's cu_seqlens and longest document, so documents stay apart at any micro batch size and no layer reads the
  device back.

Both are installed under the implementation's own name before Ulysses registers (DeepSpeed wraps whatever
ALL_ATTENTION_FUNCTIONS holds then), so the same code runs with and without sequence parallelism. Document starts
are found as Transformers finds them (`find_packed_sequence_indices`: position_ids not continuing by +1).
Models with a sliding window keep Transformers' masks (the window lives in the mask).
"""
from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

FLASH = ("flash_attention_2", "flash_attention_3")
# The wrappers this module made: installing is idempotent (a wrapper already in Transformers' table is not wrapped
# again).
_WRAPPERS: weakref.WeakSet[Callable[..., Any]] = weakref.WeakSet()


def _ours(fn: Callable[..., Any]) -> Callable[..., Any]:
    _WRAPPERS.add(fn)
    return fn


def bucket_length(n: int, smallest: int = 16) -> int:
    """n rounded up to the next of smallest, ..., 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, ... (four values per octave:
    at most 25% padding, and a new document length rarely brings a new kernel shape)."""
    if n <= smallest:
        return smallest
    step = 1 << max(0, (n - 1).bit_length() - 3)
    return -(-n // step) * step


# Slots of one padded call per token beyond which the documents are split by octave of their length: one long
# document among many short ones would otherwise multiply the call's memory and work by up to the document count.
# The one-call layouts measured fastest held 2.2 to 2.5 slots per token (bench/results/packed-attention-cpu.md).
MAX_PADDING = 4.0


def _padded(first: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Documents (flat first token, length) padded to one length: the [rows, L] token index of every slot (padding
    repeats the document's last token; filler rows repeat token 0) and the flat slots that hold a document's own
    tokens, in document order."""
    size, rows = bucket_length(int(lengths.max())), bucket_length(len(first), smallest=1)
    slots = np.arange(size)
    index = np.minimum(first[:, None] + slots, (first + lengths - 1)[:, None])
    index = np.concatenate([index, np.zeros((rows - len(first), size), dtype=index.dtype)])
    real = np.concatenate([lengths, np.zeros(rows - len(first), dtype=lengths.dtype)])
    return index, np.flatnonzero(slots[None, :] < real[:, None])


class DocumentLayout:
    """Where the documents of a packed micro batch lie, found on the host from its position_ids (numpy or a CPU
    tensor: nothing is read back from a device), and the index tensors that lay them out for attention.

    Every document is padded to one length L, `bucket_length` of the longest, and the micro batch's documents become
    one [n, heads, L, d] `is_causal` call (n, the document count, rounded up the same way with filler rows: so L
    and n take few values and a new document length rarely brings a new kernel shape). A document's padding comes
    after its last token, so causal attention never lets a real query see it, and its rows are dropped. Where that
    call would hold more than MAX_PADDING slots per token (one long document among many short ones), the documents
    are split by octave of their length instead, if that holds fewer: one call per octave present. The
    index tensors are made once per micro batch and device; every layer and the backward reuse them. The method
    was chosen by measurement among FlexAttention, nested jagged tensors and padding (bench/packed_attention.py,
    bench/results/packed-attention-cpu.md)."""

    def __init__(self, position_ids):
        pos = np.asarray(position_ids)
        self.shape = tuple(pos.shape)
        b, s = self.shape
        starts = np.ones((b, s), dtype=bool)
        starts[:, 1:] = np.diff(pos, axis=1) != 1
        first = np.flatnonzero(starts)  # flat token index (row * s + t) of each document's first token
        lengths = np.diff(np.append(first, b * s))
        self.documents = len(first)
        self.single = self.documents == b  # one document per row: plain causal attention
        self.groups = [_padded(first, lengths)]
        if self.groups[0][0].size > MAX_PADDING * b * s:
            octave = np.array([(int(n) - 1).bit_length() for n in lengths])
            by_octave = [_padded(first[octave == o], lengths[octave == o]) for o in np.unique(octave)]
            if sum(index.size for index, _ in by_octave) < self.groups[0][0].size:
                self.groups = by_octave
        # where each group's kept tokens go: none to reorder with one group (its documents are in token order)
        order = np.concatenate([index.reshape(-1)[keep] for index, keep in self.groups])
        self.inverse = None if len(self.groups) == 1 else np.argsort(order)
        # flash varlen over the b*S tokens as one row: document boundaries and the longest document
        self.cu_seqlens = np.append(first, b * s).astype(np.int32)
        self.longest = int(lengths.max())
        self._on: dict[torch.device, tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor | None]] = {}
        self._cu_on: dict[torch.device, torch.Tensor] = {}

    def __getstate__(self):  # travels between ranks (Ulysses' data adapter) without its device tensors
        return {**self.__dict__, "_on": {}, "_cu_on": {}}

    def varlen(self, device: torch.device) -> dict:
        """Transformers' flash varlen keyword arguments (FlashAttentionKwargs) for the micro batch as one row."""
        if device not in self._cu_on:
            self._cu_on[device] = torch.from_numpy(self.cu_seqlens).to(device, non_blocking=True)
        cu = self._cu_on[device]
        return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": self.longest, "max_length_k": self.longest}

    def tensors(self, device: torch.device) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor | None]:
        if device not in self._on:
            def put(a: np.ndarray) -> torch.Tensor:
                return torch.from_numpy(a).to(device, non_blocking=True)

            self._on[device] = ([(put(i), put(k)) for i, k in self.groups],
                                None if self.inverse is None else put(self.inverse))
        return self._on[device]

    def attend(self, attention: Callable[..., torch.Tensor], query, key, value) -> torch.Tensor:
        """`attention(q, k, v)` ([n, heads, L, d] each, `is_causal`, returning [n, L, heads, d]) over the documents,
        one call per group (one group but for skewed lengths); returns [batch, S, heads, d] in the tokens' order."""
        groups, inverse = self.tensors(query.device)
        b, s = self.shape

        def flat(x):  # [b, heads, s, d] -> [heads, b*s, d]
            return x.transpose(0, 1).reshape(x.shape[1], b * s, x.shape[3])

        q, k, v = flat(query), flat(key), flat(value)
        pieces = []
        for index, keep in groups:
            out = attention(*(x[:, index].transpose(0, 1) for x in (q, k, v)))  # [n, heads, L, d] in
            pieces.append(out.reshape(-1, *out.shape[2:]).index_select(0, keep))  # [tokens, heads, d]
        out = pieces[0] if inverse is None else torch.cat(pieces).index_select(0, inverse)
        return out.reshape(b, s, *out.shape[1:])


class _CurrentLayout:
    """The layout of the micro batch being trained (set by the trainer from its host-side batch, so that no layer
    reads position_ids back from the device), else one found from position_ids: once per forward without Ulysses
    (every layer gets the same tensor), keyed by the tensor object itself (a weak reference), never by its address."""

    def __init__(self):
        self.given: DocumentLayout | None = None
        self.ref = None
        self.version = -1
        self.found: DocumentLayout | None = None

    def __call__(self, pos: torch.Tensor) -> DocumentLayout:
        if self.given is not None and self.given.shape == tuple(pos.shape):
            return self.given
        if self.ref is None or self.ref() is not pos or self.version != pos._version or self.found is None:
            self.ref, self.version, self.found = weakref.ref(pos), pos._version, DocumentLayout(pos.cpu())
        return self.found


LAYOUT = _CurrentLayout()


@contextlib.contextmanager
def documents(layout: DocumentLayout | None) -> Iterator[None]:
    """Attention in this block (a micro batch's forward and backward, recomputation included) uses `layout`."""
    LAYOUT.given = layout
    try:
        yield
    finally:
        LAYOUT.given = None


def sdpa_by_document(inner):
    """Wrap Transformers' sdpa attention function: the documents of a packed row in one `is_causal` call per bucket
    length (DocumentLayout), instead of a mask."""

    def attention(module, query, key, value, attention_mask, *args, **kwargs):
        pos = kwargs.get("position_ids")
        if attention_mask is not None or pos is None or query.shape[2] <= 1 or pos.shape[-1] != query.shape[2]:
            return inner(module, query, key, value, attention_mask, *args, **kwargs)
        kwargs.pop("is_causal", None)  # causal within each document: the module's own flag (decoders: True)
        layout = LAYOUT(pos)
        if layout.single:
            return inner(module, query, key, value, None, *args, **kwargs)
        return layout.attend(lambda q, k, v: inner(module, q, k, v, None, *args, **kwargs)[0], query, key, value), None

    return _ours(attention)


def flash_flattened(inner):
    """Wrap Transformers' flash attention function: a micro batch of b packed rows runs as one row of b*S tokens,
    with flash varlen's cu_seqlens and longest document handed over from the host-side layout (Transformers' own
    path finds them from position_ids, reading the device back in every layer)."""

    def attention(module, query, key, value, attention_mask, *args, **kwargs):
        pos = kwargs.get("position_ids")
        b, s = query.shape[0], query.shape[2]
        if attention_mask is not None or pos is None or s <= 1 or pos.shape[-1] != s:
            return inner(module, query, key, value, attention_mask, *args, **kwargs)

        def flat(x):  # [b, heads, s, d] -> [1, heads, b*s, d], row-major over (b, s)
            return x.transpose(0, 1).reshape(1, x.shape[1], b * s, x.shape[3])

        kwargs.update(LAYOUT(pos).varlen(query.device), position_ids=pos.reshape(1, b * s))
        out, weights = inner(module, flat(query), flat(key), flat(value), None, *args, **kwargs)
        return out.reshape(b, s, *out.shape[2:]), weights

    return _ours(attention)


def _no_sdpa_mask(original):
    def mask(*args, **kwargs):
        if kwargs.get("attention_mask") is not None:  # a padding mask given: Transformers' mask (never read here)
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

