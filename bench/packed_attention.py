"""Attention over packed documents without flash-attn: which method the trainer uses, by measurement.

One packed row of `--seq` tokens holding documents of random lengths (`--min-doc` to `--max-doc` tokens, a new
draw every step, as packed text brings new lengths at every step), GQA heads as the test model's. Per method:
forward + backward of one attention layer, the attention kernel calls it makes (aten SDPA / flex ops counted by a
dispatch mode), its first call (compile or plan set-up included) and the median of the following steps, and the
largest difference of its output and input gradients from the per-document loop.

  loop         one `is_causal` SDPA call per document (the trainer's former way; the reference)
  flex         FlexAttention (torch.compile'd) with a document block mask built on the device
  nested       SDPA over a nested jagged tensor (offsets = document starts), `is_causal`
  buckets      documents padded to the next power-of-two length, one batched `is_causal` SDPA call per length
  padded       every document padded to one length (attention.bucket_length of the longest), one batched call: the
               trainer's code (attention.DocumentLayout)
  dense-mask   one SDPA call with an S x S boolean document mask (Transformers' own sdpa path; O(S^2) memory)

Prints a table; asserts nothing. Usage: .venv/bin/python bench/packed_attention.py [--seq 2048] [--steps 5]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker.trainer.attention import DocumentLayout

ATTENTION_OPS = {"_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_attention_math",
                 "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_cudnn_attention", "flex_attention"}


def document_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """[batch, S] -> [batch, S]: the index of each token's document in its row (0, 0, 0, 1, 1, 2, ...), found on the
    device without reading anything back (a document starts where position_ids do not continue by +1)."""
    starts = torch.ones_like(position_ids, dtype=torch.bool)
    starts[:, 1:] = torch.diff(position_ids, dim=-1) != 1
    return starts.cumsum(-1) - 1


class CountAttention(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in ATTENTION_OPS:
            self.calls += 1
        return func(*args, **(kwargs or {}))


def draw_lengths(seq: int, lo: int, hi: int, gen: torch.Generator) -> list[int]:
    out: list[int] = []
    while sum(out) < seq:
        out.append(int(torch.randint(lo, hi + 1, (1,), generator=gen)))
    out[-1] -= sum(out) - seq
    return [n for n in out if n > 0]


def positions(lengths: list[int]) -> torch.Tensor:
    return torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)


def loop(q, k, v, lengths, pos):
    out, a = [], 0
    for n in lengths:
        out.append(F.scaled_dot_product_attention(q[:, :, a:a + n], k[:, :, a:a + n], v[:, :, a:a + n],
                                                  is_causal=True, enable_gqa=True))
        a += n
    return torch.cat(out, dim=2)


def flex(q, k, v, lengths, pos):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    doc = document_ids(pos)

    def same_document(b, h, i, j):
        return (doc[b, i] == doc[b, j]) & (i >= j)

    mask = create_block_mask(same_document, 1, None, q.shape[2], q.shape[2], device=q.device.type)
    return torch.compile(flex_attention, dynamic=False)(q, k, v, block_mask=mask, enable_gqa=True)


def nested(q, k, v, lengths, pos):
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    groups = q.shape[1] // k.shape[1]

    def jag(x):  # [1, h, S, d] -> nested [docs, h, j, d]
        values = x[0].transpose(0, 1).contiguous()  # [S, h, d]
        return torch.nested.nested_tensor_from_jagged(values, offsets, max_seqlen=max(lengths)).transpose(1, 2)

    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    out = F.scaled_dot_product_attention(jag(q), jag(k), jag(v), is_causal=True)
    return out.transpose(1, 2).values().transpose(0, 1).unsqueeze(0)


def padded(q, k, v, lengths, pos):
    """The trainer's way (attention.DocumentLayout): every document padded to one bucket length, one call."""
    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2)

    return DocumentLayout(pos).attend(sdpa, q, k, v).transpose(1, 2)


def buckets(q, k, v, lengths, pos):
    """Documents grouped by the next power of two of their length: one batched call per group."""
    first = [0, *torch.tensor(lengths).cumsum(0).tolist()[:-1]]
    groups: dict[int, list[tuple[int, int]]] = {}
    for a, n in zip(first, lengths, strict=True):
        groups.setdefault(max(16, 1 << (n - 1).bit_length()), []).append((a, n))
    pieces, where = [], []
    for size, docs in groups.items():
        start, n = torch.tensor([a for a, _ in docs]), torch.tensor([n for _, n in docs])
        index = torch.minimum(start[:, None] + torch.arange(size), (start + n - 1)[:, None])

        def take(x, index=index):
            return x[0][:, index].transpose(0, 1)  # [docs, h, size, d]

        o = F.scaled_dot_product_attention(take(q), take(k), take(v), is_causal=True, enable_gqa=True)
        real = torch.arange(size) < n[:, None]
        pieces.append(o.transpose(1, 2)[real])  # [tokens, h, d]
        where.append(index[real])
    out = torch.empty(q.shape[2], q.shape[1], q.shape[3]).index_put((torch.cat(where),), torch.cat(pieces))
    return out.transpose(0, 1).unsqueeze(0)


def dense_mask(q, k, v, lengths, pos):
    doc = document_ids(pos)[0]
    causal = torch.ones(pos.shape[-1], pos.shape[-1], dtype=torch.bool).tril()
    mask = causal & (doc[:, None] == doc[None, :])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


METHODS = {"loop": loop, "flex": flex, "nested": nested, "buckets": buckets, "padded": padded,
           "dense-mask": dense_mask}


def step(fn, qkv, lengths):
    q, k, v = (x.clone().requires_grad_() for x in qkv)
    with CountAttention() as counted:
        t0 = time.perf_counter()
        out = fn(q, k, v, lengths, positions(lengths))
        out.square().sum().backward()
        took = time.perf_counter() - t0
    return took, counted.calls, [out.detach(), q.grad, k.grad, v.grad]


def run(seq: int, steps: int, heads: int, kv_heads: int, dim: int, lo: int, hi: int):
    gen = torch.Generator().manual_seed(0)
    draws = [draw_lengths(seq, lo, hi, gen) for _ in range(steps + 1)]
    inputs = [[torch.randn(1, h, seq, dim, generator=gen) for h in (heads, kv_heads, kv_heads)] for _ in draws]
    print(f"S={seq}, heads {heads} (kv {kv_heads}), head_dim {dim}, documents {lo}-{hi} tokens "
          f"({statistics.mean(len(d) for d in draws):.1f} per row), {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}; methods alternated step by step")
    runnable, first, refused = {}, {}, {}
    for name, fn in METHODS.items():
        try:
            first[name] = step(fn, inputs[0], draws[0])[0]
            runnable[name] = fn
        except (NotImplementedError, RuntimeError) as e:
            refused[name] = str(e).splitlines()[0]
    times: dict[str, list[float]] = {n: [] for n in runnable}
    calls = dict.fromkeys(runnable, 0)
    diff = dict.fromkeys(runnable, 0.0)
    for lengths, qkv in zip(draws[1:], inputs[1:], strict=True):
        ref = None
        for name, fn in runnable.items():
            took, n, got = step(fn, qkv, lengths)
            ref = got if ref is None else ref  # "loop" runs first: the reference
            times[name].append(took)
            calls[name] = max(calls[name], n)
            diff[name] = max(diff[name], *((a - b).abs().max().item() for a, b in zip(got, ref, strict=True)))
    print(f"{'method':<11} | {'kernel calls (fwd)':>18} | {'first s':>8} | {'fwd+bwd ms (median)':>19} | "
          f"{'max |diff|':>10}")
    for name in runnable:
        print(f"{name:<11} | {calls[name]:>18} | {first[name]:>8.2f} | {1e3 * statistics.median(times[name]):>19.1f} | "
              f"{diff[name]:>10.1e}")
    for name, why in refused.items():
        print(f"{name:<11} | cannot train here: {why}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq", type=int, nargs="+", default=[2048])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--min-doc", type=int, default=16)
    p.add_argument("--max-doc", type=int, default=600)
    a = p.parse_args()
    for seq in a.seq:
        run(seq, a.steps, a.heads, a.kv_heads, a.head_dim, a.min_doc, a.max_doc)


if __name__ == "__main__":
    main()
