"""Built-in model and GPU catalog, and the architecture numbers the planner works from.

The CSVs in ./data are copies of ../shared/reference/{models,gpus}.csv (published config.json values and vendor
datasheets), so this package is self-contained. A plan may instead carry any Hugging Face `config.json` dict
(`model.config`) or a custom GPU object with the gpus.csv columns.
"""
from __future__ import annotations

import csv
import functools
from dataclasses import asdict, dataclass
from pathlib import Path

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

    @property
    def mlp_width(self) -> int:
        """Intermediate width one token's activations see (the dense MLP, or its routed experts together)."""
        return self.experts_per_token * self.moe_intermediate_size if self.num_experts else self.intermediate_size

    @property
    def mlp_params(self) -> int:
        h = self.hidden_size
        if self.num_experts:
            return self.num_experts * 3 * h * self.moe_intermediate_size + h * self.num_experts   # + router
        return 3 * h * self.intermediate_size

    # ---- parameter counts (elements) -------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def layer_matmul_params(self) -> int:
        """Weights one token multiplies in a decoder layer: q, k, v, o and the SwiGLU gate/up/down (MoE: the
        routed experts and the router)."""
        h = self.hidden_size
        mlp = 3 * h * self.mlp_width + (h * self.num_experts if self.num_experts else 0)
        return h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h + mlp

    @property
    def attn_params(self) -> int:
        h = self.hidden_size
        return h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h

    @property
    def layer_params(self) -> int:
        extra = 2 * self.hidden_size  # input and post-attention RMSNorm weights
        if self.qk_norm:
            extra += 2 * self.head_dim
        if self.qkv_bias:
            extra += self.q_dim + 2 * self.kv_dim
        return self.attn_params + self.mlp_params + extra

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Separate lm_head weight (0 when tied to the input embedding)."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        return (self.num_hidden_layers * self.layer_params + self.embedding_params + self.lm_head_params
                + self.hidden_size)  # final norm

    @property
    def matmul_params(self) -> int:
        """Weights that take part in a matmul per token (the lm_head matmul happens even when tied)."""
        return self.num_hidden_layers * self.layer_matmul_params + self.vocab_size * self.hidden_size

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


REQUIRED_CONFIG_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                        "vocab_size")


def model_from_config(cfg: dict, name: str = "custom") -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json dict (text_config is used for multimodal wrappers).

    Raises ValueError naming the missing/bad key; validate.py turns that into a field error.
    """
    if not isinstance(cfg, dict):
        raise ValueError("model.config must be a JSON object (a Hugging Face config.json)")
    if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg["text_config"], "model_type": cfg["text_config"].get("model_type", cfg.get("model_type"))}
    missing = [k for k in REQUIRED_CONFIG_KEYS if k not in cfg]
    if missing:
        raise ValueError(f"model.config lacks {', '.join(missing)}")
    try:
        h = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        kv = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or (h // heads if heads else 0))
        vals = dict(hidden_size=h, num_hidden_layers=int(cfg["num_hidden_layers"]), num_attention_heads=heads,
                    num_key_value_heads=kv, head_dim=head_dim, intermediate_size=int(cfg["intermediate_size"]),
                    vocab_size=int(cfg["vocab_size"]))
    except (TypeError, ValueError) as e:
        raise ValueError(f"model.config has a non-integer size: {e}") from None
    bad = [k for k, v in vals.items() if v <= 0]
    if bad:
        raise ValueError(f"model.config: {', '.join(bad)} must be positive")
    mtype = str(cfg.get("model_type") or "llama")
    mpe = cfg.get("max_position_embeddings")
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 0)
    moe = {}
    if experts > 1:
        moe = dict(num_experts=experts, experts_per_token=int(cfg.get("num_experts_per_tok") or 1),
                   moe_intermediate_size=int(cfg.get("moe_intermediate_size") or vals["intermediate_size"]))
    return ModelSpec(
        name=str(cfg.get("_name_or_path") or name), **vals,
        tie_word_embeddings=_bool(cfg.get("tie_word_embeddings", False)),
        max_position_embeddings=int(mpe) if isinstance(mpe, (int, float)) and mpe else None,
        model_type=mtype, qk_norm=mtype in QK_NORM_MODEL_TYPES,
        qkv_bias=_bool(cfg.get("attention_bias", mtype in QKV_BIAS_MODEL_TYPES)), **moe)


def gpu_from_object(obj: dict) -> GpuSpec:
    """A custom GPU given as an object with the gpus.csv columns. Raises ValueError naming the bad key."""
    missing = [k for k in GPU_FIELDS if k not in obj]
    if missing:
        raise ValueError(f"custom GPU lacks {', '.join(missing)} (columns: name, {', '.join(GPU_FIELDS)})")
    try:
        vals = {k: float(obj[k]) for k in GPU_FIELDS}
    except (TypeError, ValueError):
        raise ValueError("custom GPU figures must be numbers") from None
    if any(v <= 0 for v in vals.values()):
        raise ValueError("custom GPU figures must be positive")
    return GpuSpec(name=str(obj.get("name", "custom")), **vals)


def catalog() -> dict:
    """`GET /api/catalog`: every preset model (with its parameter count) and every GPU."""
    return {"models": [m.as_dict() for m in models().values()], "gpus": [g.as_dict() for g in gpus().values()]}
