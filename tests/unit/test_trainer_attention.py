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
from worker.trainer.attention import document_spans, flash_flattened, install_document_attention, sdpa_by_document
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


def packed(seq_len: int, rows: int, max_doc: int = 120) -> dict[str, torch.Tensor]:
    rng = random.Random(0)
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


def test_document_spans_follow_transformers_packed_detection():
    pos = torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]])
    assert document_spans(pos) == [[(0, 3), (3, 5), (5, 6)], [(0, 6)]]


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
    """Transformers' flash path as it decides (modeling_flash_attention_utils._is_packed_sequence): varlen from
    position_ids only at batch size 1, plain causal attention otherwise; computed here with per-document sdpa."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.shape[0] == 1:
        return sdpa_by_document(sdpa_attention_forward)(module, query, key, value, None, *args, **kwargs)
    kwargs.pop("position_ids", None)
    return sdpa_attention_forward(module, query, key, value, None, *args, **kwargs)


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
