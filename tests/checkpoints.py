"""A tiny Llama checkpoint saved with Transformers' own save_pretrained (config, weights and a word-level tokenizer),
so runs load it through the real from_pretrained path; nothing is downloaded."""
from __future__ import annotations

from pathlib import Path

from tests.tiny import WORDS, tiny_plan


def save_tiny_checkpoint(directory: Path, weights: bool = True, **overrides) -> Path:
    """Save the architecture of tests.tiny.tiny_plan() (with `overrides`, e.g. hidden_size=128) into
    `directory`; `weights=False` writes config.json only (enough for the architecture checks)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**{**tiny_plan()["model"]["config"], **overrides})
    directory.mkdir(parents=True, exist_ok=True)
    if not weights:
        config.save_pretrained(directory)
        return directory
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(directory)
    return save_tiny_tokenizer(directory)


def save_tiny_tokenizer(directory: Path) -> Path:
    """A word-level fast tokenizer of tests.tiny's words, saved with save_pretrained (tokenizer.json)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<unk>", "<eos>", "<pad>", ".", *sorted(set(WORDS))])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    directory.mkdir(parents=True, exist_ok=True)
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>",
                            pad_token="<pad>").save_pretrained(directory)
    return directory


def save_preset_config(directory: Path, preset: str) -> Path:
    """A config.json with a catalog preset's architecture (and a tokenizer), no weights: a big model's checkpoint as
    submit and approval check it (the run itself would fail at load; tests that use it stop the run before)."""
    import json

    from backend.inputs.model_source import ARCHITECTURE
    from plan import catalog

    m = catalog.models()[preset]
    directory.mkdir(parents=True, exist_ok=True)
    keys = (*ARCHITECTURE, "intermediate_size", "head_dim")
    (directory / "config.json").write_text(json.dumps({k: getattr(m, k) for k in keys}))
    return save_tiny_tokenizer(directory)  # a checkpoint's tokenizer, as approval checks it
