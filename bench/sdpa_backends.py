"""Which scaled_dot_product_attention backend torch picks for the trainer's attention shapes, each backend's
forward+backward TFLOPS, and what a new sequence length costs on its first call.

Shapes (CUDA, bf16): the ~1B Llama's attention (32 query heads, 8 KV heads, head dim 64) over one 16,384-token
document, and over one 3,001-token document (a 3,000-byte document of the check's data with its EOS). The call is
the one Transformers makes without a mask: `is_causal=True, enable_gqa=True` (transformers/integrations/
sdpa_attention.py use_gqa_in_sdpa). CPU (make gpu-rehearsal, fp32): the tiny model's heads at 512 and 301 tokens.

- picks: the aten op the dispatcher ran for one forward+backward with no backend forced (torch.profiler's op names,
  `aten::_scaled_dot_product_<backend>_attention`), read under the environment this process got: run it again with
  TORCH_CUDNN_SDPA_PREFERRED=0 to see the switch the window's "cuDNN off" rows use.
- backends: each SDPBackend forced in turn (sdpa_kernel); unsupported ones record torch's refusal. TFLOPS count
  the planner's attention FLOPs (plan/catalog.py flops_per_token: causal attention, forward + backward, no
  recompute), the same count the trainer's MFU uses. The math backend is skipped where its S x S scores would
  pass MATH_MAX_GIB.
- new_lengths: 5 lengths never run before in this process, the first and second forward+backward of each with no
  backend forced (a backend that builds a plan per shape, as cuDNN does, pays it on the first call).

Usage: python bench/sdpa_backends.py [--cpu] [--picks-only] [--json OUT]
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.kernel_bench import Bench, model_spec, write_json

MATH_MAX_GIB = 8.0  # fp32 scores of one call: 16K tokens x 32 heads would be 32 GiB
OPS = {"_scaled_dot_product_cudnn_attention": "cudnn", "_scaled_dot_product_flash_attention_for_cpu": "flash (cpu)",
       "_scaled_dot_product_flash_attention": "flash", "_scaled_dot_product_efficient_attention": "efficient",
       "_scaled_dot_product_attention_math": "math",
       "_scaled_dot_product_fused_attention_overrideable": "overrideable"}


class Attention:
    def __init__(self, b: Bench):
        self.b = b
        c = b.config
        self.heads, self.kv = c["num_attention_heads"], c["num_key_value_heads"]
        self.head_dim = c["hidden_size"] // self.heads
        self.spec = model_spec(c)

    def shapes(self) -> dict[str, int]:
        return ({"llama-1b-16384-gqa": 16384, "document-3001": 3001} if self.b.cuda
                else {"tiny-512-gqa": 512, "document-301": 301})

    def flops(self, s: int) -> float:
        """Attention FLOPs of one forward+backward over s tokens: the attention term of the planner's
        flops_per_token (all layers, per token) for one layer and s tokens."""
        m = self.spec
        return (m.flops_per_token(s) - 6 * m.matmul_params) / m.num_hidden_layers * s

    def step(self, s: int):
        t = self.b.torch
        g = t.Generator(device=self.b.device).manual_seed(s)

        def make(h: int):
            return t.randn(1, h, s, self.head_dim, device=self.b.device, dtype=self.b.dtype, generator=g,
                           requires_grad=True)

        q, k, v = make(self.heads), make(self.kv), make(self.kv)

        def run():
            out = t.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            out.backward(t.ones_like(out))
        return run

    def pick(self, s: int) -> str:
        from torch.profiler import ProfilerActivity, profile

        run = self.step(s)
        run()  # outside the profile: the first call's plan building is not the question here
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run()
            self.b.sync()
        seen = {OPS[e.name.removeprefix("aten::")] for e in prof.events() if e.name.removeprefix("aten::") in OPS}
        return ", ".join(sorted(seen)) or "none of " + ", ".join(OPS)

    def backend(self, s: int, name: str) -> dict:
        t = self.b.torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if name == "MATH":
            gib = self.heads * s * s * 4 / 2**30
            if gib > MATH_MAX_GIB:
                return {"status": f"skipped: the math backend's S x S scores would take {gib:.0f} GiB"}
        try:
            with sdpa_kernel([getattr(SDPBackend, name)]):
                run = self.step(s)
                run()
                sec = self.b.repeat(run, min_s=1.0 if self.b.cuda else 0.2, max_reps=50)
        except RuntimeError as e:  # torch refuses a backend that does not take this shape, dtype or device
            return {"status": "unsupported: " + str(e).strip().splitlines()[0][:300]}
        finally:
            if self.b.cuda:
                t.cuda.empty_cache()
        return {"status": "ok", "ms": round(1000 * sec, 3), "tflops": float(f"{self.flops(s) / sec / 1e12:.4g}")}

    def new_lengths(self) -> list[dict]:
        lengths = (3001, 2999, 2897, 3011, 1709) if self.b.cuda else (301, 299, 289, 311, 171)
        out = []
        for s in lengths:
            run = self.step(s)
            first, second = self.b.once(run), self.b.once(run)
            out.append({"seq_len": s, "first_ms": round(1000 * first, 3), "second_ms": round(1000 * second, 3),
                        "first_over_second": round(first / second, 2)})
        return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--picks-only", action="store_true", help="only which backend torch picks")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    b = Bench(a.cpu)
    att = Attention(b)
    out = {**b.header(), "TORCH_CUDNN_SDPA_PREFERRED": os.environ.get("TORCH_CUDNN_SDPA_PREFERRED"),
           "heads": att.heads, "kv_heads": att.kv, "head_dim": att.head_dim}
    out["picks"] = {name: att.pick(s) for name, s in att.shapes().items()}
    if not a.picks_only:
        out["backends"] = {name: {be: att.backend(s, be) for be in ("CUDNN_ATTENTION", "FLASH_ATTENTION",
                                                                    "EFFICIENT_ATTENTION", "MATH")}
                           for name, s in att.shapes().items()}
        out["new_lengths"] = att.new_lengths()
    write_json(a.json, out)


if __name__ == "__main__":
    main()
