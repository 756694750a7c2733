"""Built-in model and GPU catalog, and the one copy of the architecture arithmetic: parameter count, FLOPs per
token and peak TFLOPS. The planner, the trainer's MFU and the DeepSpeed config all read them from here.

./data/models.csv holds published config.json values and ./data/gpus.csv vendor datasheet figures (each file names
its source in its header). A plan may instead carry any Hugging Face `config.json` dict (`model.config`) or a
custom GPU object with the gpus.csv columns.
"""
from __future__ import annotations

import csv
import functools
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"

GPU_FIELDS = ("memory_gib", "hbm_tb_per_s", "bf16_dense_tflops", "nvlink_gb_per_s_per_direction",
              "typical_internode_gb_per_s")
# Model types whose attention normalizes q and k per head (Qwen3 adds q_norm/k_norm RMSNorms on head_dim).
QK_NORM_MODEL_TYPES = {"qwen3", "qwen3_moe", "olmo2", "gemma3"}
# Model types whose q/k/v projections carry a bias by default (Qwen2 / Qwen2.5).
QKV_BIAS_MODEL_TYPES = {"qwen2"}


@dataclass(frozen=True)
class ModelSpec:
    name: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int | None
    model_type: str = "llama"
    qk_norm: bool = False
    qkv_bias: bool = False
    # Mixture of experts (0 = dense): every expert's weights count as parameters, only the routed ones as FLOPs
    # and activations (a token's routed experts behave as one MLP of width experts_per_token x moe width).
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    # Shared experts every token passes through besides its routed ones (total width): Qwen2-MoE's
    # `shared_expert_intermediate_size` (modeling_qwen2_moe.py: shared_expert = Qwen2MoeMLP(intermediate_size=...)
    # plus a 1-wide sigmoid shared_expert_gate), DeepSeek-V2/V3's `n_shared_experts` x `moe_intermediate_size`.
    shared_expert_size: int = 0
    shared_expert_gate: bool = False
    # MoE models' dense layers (a plain SwiGLU MLP of dense_intermediate_size instead of the experts): DeepSeek's
    # first_k_dense_replace, Qwen-MoE's mlp_only_layers / decoder_sparse_step, Llama 4's moe_layers /
    # interleave_moe_layer_step (model_from_config reads them as transformers' modeling code does).
    dense_layers: int = 0
    dense_intermediate_size: int = 0

    @property
    def routed_width(self) -> int:
        """An MoE layer's intermediate width per token: its routed experts together plus the shared ones."""
        return self.experts_per_token * self.moe_intermediate_size + self.shared_expert_size

    @property
    def mlp_width(self) -> int:
        """Intermediate width one token's activations see in the widest layer (the dense MLP, or an MoE layer's
        routed and shared experts, or a dense layer of an MoE model)."""
        if self.num_experts:
            return max(self.routed_width, self.dense_intermediate_size if self.dense_layers else 0)
        return self.intermediate_size

    @property
    def moe_layers(self) -> int:
        return self.num_hidden_layers - self.dense_layers if self.num_experts else 0

    @property
    def mlp_params(self) -> int:
        h = self.hidden_size
        if self.num_experts:
            shared = 3 * h * self.shared_expert_size + (h if self.shared_expert_gate else 0)
            return self.num_experts * 3 * h * self.moe_intermediate_size + h * self.num_experts + shared  # + router
        return 3 * h * self.intermediate_size

    # ---- parameter counts (elements) -------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def layer_matmul_params(self) -> float:
        """Weights one token multiplies in a decoder layer, on average over the layers: q, k, v, o and the SwiGLU
        gate/up/down (MoE: the routed and shared experts and the router; its dense layers: their MLP)."""
        h = self.hidden_size
        if self.num_experts:
            moe = 3 * h * self.routed_width + h * self.num_experts
            dense = 3 * h * self.dense_intermediate_size
            mlp = (self.moe_layers * moe + self.dense_layers * dense) / self.num_hidden_layers
        else:
            mlp = 3 * h * self.intermediate_size
        return h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h + mlp

    @property
    def attn_params(self) -> int:
        h = self.hidden_size
        return h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h

    @property
    def _attn_and_norms(self) -> int:
        extra = 2 * self.hidden_size  # input and post-attention RMSNorm weights
        if self.qk_norm:
            extra += 2 * self.head_dim
        if self.qkv_bias:
            extra += self.q_dim + 2 * self.kv_dim
        return self.attn_params + extra

    @property
    def layer_params(self) -> int:
        """Parameters of the largest decoder layer (what ZeRO-3 gathers for one layer)."""
        dense = 3 * self.hidden_size * self.dense_intermediate_size if self.dense_layers else 0
        return self._attn_and_norms + max(self.mlp_params, dense)

    @property
    def layers_params(self) -> int:
        """Parameters of every decoder layer together (an MoE model's dense layers at their own size)."""
        if not self.num_experts:
            return self.num_hidden_layers * (self._attn_and_norms + self.mlp_params)
        dense = 3 * self.hidden_size * self.dense_intermediate_size
        return (self.num_hidden_layers * self._attn_and_norms + self.moe_layers * self.mlp_params
                + self.dense_layers * dense)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Separate lm_head weight (0 when tied to the input embedding)."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        return (self.layers_params + self.embedding_params + self.lm_head_params
                + self.hidden_size)  # final norm

    @property
    def matmul_params(self) -> float:
        """Weights that take part in a matmul per token (the lm_head matmul happens even when tied)."""
        return self.num_hidden_layers * self.layer_matmul_params + self.vocab_size * self.hidden_size

    def flops_per_token(self, seq_len: int) -> float:
        """Model FLOPs per trained token (forward + backward, no recompute): 6 per matmul weight a token multiplies
        (Kaplan et al. 2020; the lm_head counts, the embedding lookup does not; MoE: the routed experts only) plus
        causal attention 6 * L * a * d * S (PaLM appendix B's 12 * L * a * d * S, halved for the causal mask,
        which flash attention skips). The planner's TFLOPS and MFU and the trainer's measured ones both count
        this, so the prediction and the measurement on the run page are comparable."""
        return 6 * self.matmul_params + 6 * self.num_hidden_layers * self.num_attention_heads * self.head_dim * seq_len

    def as_dict(self) -> dict:
        d = asdict(self)
        d["params"] = self.total_params
        return d


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_gib: float
    hbm_tb_per_s: float
    bf16_dense_tflops: float
    nvlink_gb_per_s_per_direction: float
    typical_internode_gb_per_s: float

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for a training dtype: the datasheet's bf16/fp16 figure; fp32 trains as TF32 at
        half that rate."""
        return self.bf16_dense_tflops * 1e12 * (0.5 if dtype == "fp32" else 1.0)

    def as_dict(self) -> dict:
        return asdict(self)


def _read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#") and line.strip()))


def _bool(v) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("true", "1", "yes")
    return bool(v)


@functools.lru_cache(maxsize=1)
def models() -> dict[str, ModelSpec]:
    out = {}
    for r in _read_csv(DATA / "models.csv"):
        name = r["name"]
        mtype = "qwen3" if "qwen3" in name.lower() else "qwen2" if "qwen2" in name.lower() else (
            "mistral" if "mistral" in name.lower() else "llama")
        out[name] = ModelSpec(
            name=name, hidden_size=int(r["hidden_size"]), num_hidden_layers=int(r["num_hidden_layers"]),
            num_attention_heads=int(r["num_attention_heads"]), num_key_value_heads=int(r["num_key_value_heads"]),
            head_dim=int(r["head_dim"]), intermediate_size=int(r["intermediate_size"]), vocab_size=int(r["vocab_size"]),
            tie_word_embeddings=_bool(r["tie_word_embeddings"]),
            max_position_embeddings=int(r["max_position_embeddings"]) if r.get("max_position_embeddings") else None,
            model_type=mtype, qk_norm=mtype in QK_NORM_MODEL_TYPES, qkv_bias=mtype in QKV_BIAS_MODEL_TYPES)
    return out


@functools.lru_cache(maxsize=1)
def gpus() -> dict[str, GpuSpec]:
    return {r["name"]: GpuSpec(name=r["name"], **{k: float(r[k]) for k in GPU_FIELDS})
            for r in _read_csv(DATA / "gpus.csv")}


# A config.json's sizes, with upper bounds far beyond any published model (so no estimate overflows a float):
# (key, upper bound).
CONFIG_SIZES = (("hidden_size", 1 << 18), ("num_hidden_layers", 1 << 14), ("num_attention_heads", 1 << 14),
                ("intermediate_size", 1 << 21), ("vocab_size", 1 << 24))


class ConfigError(ValueError):
    """A config.json value the planner cannot use; `key` is the config key (the field is model.config.<key>)."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


def _size(cfg: dict, key: str, upper: int, default: int | None = None) -> int:
    v = cfg.get(key)
    if v is None:
        if default is None:
            raise ConfigError(key, "is required (a Hugging Face config.json size)")
        return default
    # v != v is NaN; infinity (JSON's 1e999) has no int() and is out of bounds anyway
    if isinstance(v, bool) or not isinstance(v, int | float) or v != v or v in (math.inf, -math.inf) or int(v) != v:
        raise ConfigError(key, f"must be a whole number, got {v!r}")
    if not 1 <= v <= upper:
        raise ConfigError(key, f"must be between 1 and {upper:,}, got {v!r}")
    return int(v)


def _layer_list(cfg: dict, key: str, layers: int) -> set[int]:
    v = cfg.get(key) or []
    if not isinstance(v, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in v):
        raise ConfigError(key, f"must be a list of layer indices, got {v!r}")
    return {i for i in v if 0 <= i < layers}


def _dense_layers(cfg: dict, mtype: str, layers: int, intermediate: int) -> tuple[int, int]:
    """(dense layers, their MLP width) of an MoE config, as transformers' modeling code picks a layer's MLP:
    Llama 4 (configuration_llama4.py): MoE at `moe_layers`, default every `interleave_moe_layer_step`-th layer
    (range(step - 1, L, step)), dense ones of `intermediate_size_mlp`; DeepSeek-V2/V3 (modeling_deepseek_v3.py:
    `if layer_idx >= config.first_k_dense_replace`; V3's config default 3, V2's 0); Qwen2/3-MoE
    (modeling_qwen2_moe.py: MoE when `layer_idx not in mlp_only_layers and (layer_idx + 1) % decoder_sparse_step
    == 0`); dense layers of `intermediate_size`."""
    if mtype.startswith("llama4"):
        if cfg.get("moe_layers") is not None:
            moe = len(_layer_list(cfg, "moe_layers", layers))
        else:
            step = _size(cfg, "interleave_moe_layer_step", layers, default=1)
            moe = len(range(step - 1, layers, step))
        return layers - moe, _size(cfg, "intermediate_size_mlp", 1 << 21, default=16384)
    if mtype.startswith("deepseek"):
        default = 3 if mtype == "deepseek_v3" else 0
        first = 0 if cfg.get("first_k_dense_replace") == 0 else _size(cfg, "first_k_dense_replace", layers,
                                                                       default=default)
        return min(first, layers), intermediate
    step = _size(cfg, "decoder_sparse_step", layers, default=1)
    only = _layer_list(cfg, "mlp_only_layers", layers)
    moe = sum(1 for i in range(layers) if i not in only and (i + 1) % step == 0)
    return layers - moe, intermediate


def model_from_config(cfg: dict, name: str = "custom") -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json dict (text_config is used for multimodal wrappers).

    Raises ConfigError naming the bad key; plan.rules turns that into the field model.config.<key>.
    """
    if not isinstance(cfg, dict):
        raise ConfigError("", "must be a JSON object (a Hugging Face config.json)")
    if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg["text_config"], "model_type": cfg["text_config"].get("model_type", cfg.get("model_type"))}
    vals: dict[str, Any] = {key: _size(cfg, key, upper) for key, upper in CONFIG_SIZES}
    h, heads = vals["hidden_size"], vals["num_attention_heads"]
    vals["num_key_value_heads"] = _size(cfg, "num_key_value_heads", heads, default=heads)
    vals["head_dim"] = _size(cfg, "head_dim", 1 << 14, default=max(1, h // heads))
    mtype = str(cfg.get("model_type") or "llama")
    mpe = cfg.get("max_position_embeddings")
    experts = _size(cfg, next((k for k in ("num_experts", "num_local_experts", "n_routed_experts") if cfg.get(k)),
                              "num_experts"), 1 << 14, default=1)
    moe: dict[str, Any] = {}
    if experts > 1:
        moe_width = _size(cfg, "moe_intermediate_size", 1 << 21, default=vals["intermediate_size"])
        qwen_shared = _size(cfg, "shared_expert_intermediate_size", 1 << 21, default=0) \
            if cfg.get("shared_expert_intermediate_size") else 0
        deepseek_shared = _size(cfg, "n_shared_experts", 1 << 14, default=0) if cfg.get("n_shared_experts") else 0
        # Llama 4: every MoE layer adds a shared expert of the experts' width (modeling_llama4.py Llama4TextMoe:
        # self.shared_expert = Llama4TextMLP(config), i.e. intermediate_size)
        llama4_shared = moe_width if mtype.startswith("llama4") else 0
        dense_layers, dense_width = _dense_layers(cfg, mtype, vals["num_hidden_layers"], vals["intermediate_size"])
        moe = dict(num_experts=experts, dense_layers=dense_layers, dense_intermediate_size=dense_width,
                   experts_per_token=_size(cfg, "num_experts_per_tok", experts, default=1),
                   moe_intermediate_size=moe_width,
                   shared_expert_size=qwen_shared + deepseek_shared * moe_width + llama4_shared,
                   shared_expert_gate=bool(qwen_shared))
    return ModelSpec(
        name=str(cfg.get("_name_or_path") or name), **vals,
        tie_word_embeddings=_bool(cfg.get("tie_word_embeddings", False)),
        max_position_embeddings=int(mpe) if isinstance(mpe, int | float) and 1 <= mpe <= 1 << 40 else None,
        model_type=mtype, qk_norm=mtype in QK_NORM_MODEL_TYPES,
        qkv_bias=_bool(cfg.get("attention_bias", mtype in QKV_BIAS_MODEL_TYPES)), **moe)


def listing() -> dict:
    """`GET /api/catalog`: every preset model (with its parameter count) and every GPU."""
    return {"models": [m.as_dict() for m in models().values()], "gpus": [g.as_dict() for g in gpus().values()]}
