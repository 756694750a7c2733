"""Attention over packed documents (worker/trainer/attention.py): the same loss as Transformers' masked sdpa, and
no S x S tensor anywhere in forward or backward at a long S."""
from __future__ import annotations

import random

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from tests.tiny import TINY_LLAMA
from worker.trainer.attention import (
    DocumentLayout,
    bucket_length,
    documents,
    flash_flattened,
    install_document_attention,
)
from worker.trainer.data import pack_documents


@pytest.fixture
def restore_attention():
    saved = dict(ALL_ATTENTION_FUNCTIONS._local_mapping), dict(ALL_MASK_ATTENTION_FUNCTIONS._local_mapping)
    yield
    ALL_ATTENTION_FUNCTIONS._local_mapping.clear()
    ALL_ATTENTION_FUNCTIONS._local_mapping.update(saved[0])
    ALL_MASK_ATTENTION_FUNCTIONS._local_mapping.clear()
    ALL_MASK_ATTENTION_FUNCTIONS._local_mapping.update(saved[1])


def tiny_model():
    cfg = dict(TINY_LLAMA)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)


def packed(seq_len: int, rows: int, max_doc: int = 120, seed: int = 0) -> dict[str, torch.Tensor]:
    rng = random.Random(seed)
    docs: list[list[int]] = []
    while sum(len(d) + 1 for d in docs) < rows * seq_len:
        docs.append([rng.randrange(256) for _ in range(min(rng.randint(5, max_doc), rows * seq_len))])
    p = pack_documents(docs, seq_len, 257, 258)
    return {k: torch.from_numpy(v[:rows]) for k, v in p.items()}


def loss(model, batch) -> torch.Tensor:
    logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits
    target = torch.nn.functional.pad(batch["labels"][..., 1:], (0, 1), value=-100)
    return torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), target.view(-1), ignore_index=-100)


class LargestTensor(TorchDispatchMode):
    """The largest tensor (elements) any op creates while active."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_the_layout_finds_documents_as_transformers_does_and_pads_them_to_one_length():
    pos = torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]])
    layout = DocumentLayout(pos.numpy())
    assert layout.documents == 4
    assert not layout.single
    [(index, keep)] = layout.groups  # one call
    assert index.shape == (4, 16)  # every document padded to bucket_length(6) slots
    # each document's slots: its tokens (flat index row * 6 + t), then its last token repeated
    assert index[:, :7].tolist() == [[0, 1, 2, 2, 2, 2, 2], [3, 4, 4, 4, 4, 4, 4], [5] * 7, [6, 7, 8, 9, 10, 11, 11]]
    assert (index.reshape(-1)[keep] == range(12)).all()  # every token once, in order
    assert DocumentLayout(torch.arange(8).reshape(1, 8).numpy()).single


def test_one_long_document_among_many_short_ones_splits_by_octave(restore_attention):
    """A 2048-token row of one 1500-token document and 27 short ones: one padded call would hold 32 x 1536 slots
    (24 x the tokens); by octave of length it holds under 3 x, in a few calls, and the loss is still Transformers'
    masked sdpa's."""
    lengths = [1500] + [20] * 27 + [2048 - 1500 - 20 * 27]
    pos = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    layout = DocumentLayout(pos.numpy())
    assert 1 < len(layout.groups) <= 4
    assert sum(index.size for index, _ in layout.groups) <= 3 * 2048
    model = tiny_model()
    ids = torch.randint(0, 256, (1, 2048), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "position_ids": pos, "labels": torch.where(pos == 0, -100, ids)}
    want = loss(model, batch).item()
    install_document_attention("sdpa", model.config)
    with documents(layout):
        got = loss(model, batch).item()
    assert abs(got - want) <= 1e-5 * abs(want), (got, want)


def test_bucket_lengths_are_few_and_pad_at_most_a_quarter():
    lengths = {bucket_length(n) for n in range(1, 16385)}
    assert len(lengths) <= 4 * 10 + 1, sorted(lengths)  # four per octave from 16 to 16K
    assert all(n <= bucket_length(n) <= max(16, 1.25 * n) for n in range(1, 16385))


def test_the_loss_equals_transformers_masked_sdpa(restore_attention):
    model, batch = tiny_model(), packed(256, rows=2)
    assert bool((batch["position_ids"][:, 1:] == 0).any()), "rows must hold several documents"
    want = loss(model, batch).item()
    install_document_attention("sdpa", model.config)
    got = loss(model, batch)
    got.backward()
    assert abs(got.item() - want) <= 1e-6, (got.item(), want)


@pytest.mark.parametrize("max_doc", [120, 10**6], ids=["packed-documents", "one-document-per-row"])
def test_no_s_by_s_tensor_at_a_long_sequence(restore_attention, max_doc):
    s = 2048
    model, batch = tiny_model(), packed(s, rows=1, max_doc=max_doc)
    with LargestTensor() as seen:  # Transformers' own sdpa path: the [1, 1, S, S] mask (packed) or not (one doc)
        loss(model, batch)
    if max_doc < s:
        assert seen.largest >= s * s, "the tracker should see Transformers' document mask"
    install_document_attention("sdpa", model.config)
    with LargestTensor() as seen:
        loss(model, batch).backward()
    # the largest tensors left are the logits (S x vocab) and the MLP activations, not S x S
    assert seen.largest <= s * TINY_LLAMA["vocab_size"] < s * s, seen.largest


def _flash_like(module, query, key, value, attention_mask, *args, **kwargs):
    """Transformers' flash path as it decides (modeling_flash_attention_utils._flash_attention_forward): varlen from
    given cu_seq_lens / max_length, else from position_ids only at batch size 1, else plain causal attention;
    computed here with sdpa over each varlen segment."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cu = kwargs.pop("cu_seq_lens_q", None)
    longest = kwargs.pop("max_length_q", None)
    for k in ("cu_seq_lens_k", "max_length_k"):
        kwargs.pop(k, None)
    if cu is None and query.shape[0] == 1:  # Transformers' own: cu_seqlens from position_ids
        pos = kwargs["position_ids"][0]
        cu = torch.cat([(pos == 0).nonzero().flatten(), torch.tensor([pos.shape[0]])])
    kwargs.pop("position_ids", None)
    if cu is None:
        return sdpa_attention_forward(module, query, key, value, None, *args, **kwargs)
    cu = cu.tolist()
    assert longest is None or longest == max(b - a for a, b in zip(cu, cu[1:])), (longest, cu)
    pieces = [sdpa_attention_forward(module, query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], None, *args,
                                     **kwargs)[0] for a, b in zip(cu, cu[1:])]
    return torch.cat(pieces, dim=1), None


def test_flash_keeps_documents_apart_at_micro_batch_above_one(restore_attention):
    model, batch = tiny_model(), packed(256, rows=2)
    install_document_attention("sdpa", model.config)
    want = loss(model, batch).item()  # per-document attention, row by row
    ALL_ATTENTION_FUNCTIONS["sdpa"] = _flash_like
    unflattened = loss(model, batch).item()
    ALL_ATTENTION_FUNCTIONS["sdpa"] = flash_flattened(_flash_like)
    got = loss(model, batch).item()
    assert abs(unflattened - want) > 1e-3, "batch 2 without flattening should attend across documents"
    assert abs(got - want) <= 1e-6, (got, want)


class AttentionKernels(TorchDispatchMode):
    """The SDPA kernels torch runs while active (forward and backward ops), and the forward calls' query shapes."""

    def __init__(self):
        super().__init__()
        self.calls = 0
        self.shapes: set[tuple[int, ...]] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "scaled_dot_product" in func.__name__:
            self.calls += 1
            if "backward" not in func.__name__:
                self.shapes.add(tuple(args[0].shape))
        return func(*args, **(kwargs or {}))


def test_one_attention_kernel_per_layer_and_pass_whatever_the_documents(restore_attention):
    """A micro batch of two packed rows (many documents): one forward and one backward SDPA kernel per layer, with
    the layout the trainer's collator makes on the host; the loss is Transformers' masked sdpa's."""
    from worker.trainer.sp_trainer import collate_packed

    model, batch = tiny_model(), packed(256, rows=2)
    want = loss(model, batch).item()
    install_document_attention("sdpa", model.config)
    layout = collate_packed([{k: v[r] for k, v in batch.items()} for r in range(2)])["documents"]
    assert layout.documents > 4
    with documents(layout), AttentionKernels() as seen:
        got = loss(model, batch)
        got.backward()
    layers = TINY_LLAMA["num_hidden_layers"]
    assert seen.calls == 2 * layers, (seen.calls, layout.documents)
    assert abs(got.item() - want) <= 1e-5 * abs(want), (got.item(), want)


def test_new_document_lengths_bring_few_kernel_shapes(restore_attention):
    """Twelve micro batches of fresh random document lengths: the attention calls take a handful of shapes (one
    per bucket of the longest document and of the document count), not one per document length."""
    model = tiny_model()
    install_document_attention("sdpa", model.config)
    lengths: set[int] = set()
    with AttentionKernels() as seen, torch.no_grad():
        for seed in range(12):
            batch = packed(256, rows=1, seed=seed)
            starts = (batch["position_ids"][0] == 0).nonzero().flatten().tolist() + [256]
            lengths |= {b - a for a, b in zip(starts, starts[1:])}
            with documents(DocumentLayout(batch["position_ids"].numpy())):
                model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False)
    assert len(lengths) > 30  # what a call per document would bring: a shape per length
    assert len(seen.shapes) <= 8, seen.shapes
