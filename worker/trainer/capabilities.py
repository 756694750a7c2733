"""What this worker can run, reported once when it starts (backend/workers): library versions, the attention
kernels its ranks can use, and its GPU model. Read from the installed distributions and one `torch.cuda` query; no
kernel is imported beyond its package's top-level module."""
from __future__ import annotations

import importlib.metadata as md
import importlib.util

# distribution name -> key of the report
PACKAGES = {"torch": "torch", "deepspeed": "deepspeed", "transformers": "transformers", "accelerate": "accelerate",
            "flash-attn": "flash_attn", "flash-attn-3": "flash_attn_3", "liger-kernel": "liger_kernel"}


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def attn_implementations(versions: dict, cuda: bool) -> list[str]:
    """The `training.attn_implementation` values this worker's ranks run as asked. Without CUDA the flash kernels
    do not run at all (the trainer uses sdpa instead: plan.launch.effective_attn)."""
    out = ["eager", "sdpa"] if versions.get("torch") else []
    if versions.get("torch") and importlib.util.find_spec("torch.nn.attention.flex_attention") is not None:
        out.append("flex_attention")
    if cuda and (versions.get("flash_attn") or "").startswith("2"):
        out.append("flash_attention_2")
    # FlashAttention-3 (Hopper) installs the module flash_attn_interface (its own distribution, or flash-attn 3.x)
    if cuda and (versions.get("flash_attn_3") or (versions.get("flash_attn") or "").startswith("3")
                 or importlib.util.find_spec("flash_attn_interface") is not None):
        out.append("flash_attention_3")
    return sorted(out)


def capabilities() -> dict:
    versions = {key: _version(dist) for dist, key in PACKAGES.items()}
    gpu_model, gpu_count, cuda = None, 0, False
    try:
        import torch

        versions["cuda"] = torch.version.cuda
        cuda = torch.cuda.is_available()
        if cuda:
            gpu_count = torch.cuda.device_count()
            gpu_model = torch.cuda.get_device_name(0)
    except ImportError:
        versions["cuda"] = None
    return {"versions": versions, "gpu_model": gpu_model, "gpu_count": gpu_count,
            "attn_implementations": attn_implementations(versions, cuda)}
