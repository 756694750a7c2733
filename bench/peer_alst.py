"""Our trainer side by side with a peer: Accelerate's own ALST example on the same model, data, ranks, SP degree,
ZeRO stage and features, run alternated, step by step.

The peer is `accelerate/test_utils/scripts/external_deps/test_ds_alst_ulysses_sp.py` as shipped in the accelerate
wheel (1.15): ParallelismConfig(sp_backend="deepspeed", sp_handler=DeepSpeedSequenceParallelConfig(...)), one
`accelerator.prepare(model, optimizer, dl)` (which wraps the loader in DeepSpeed's UlyssesSPDataLoaderAdapter), and
its loop: zero_grad, forward, `loss_function(logits, labels=None, shift_labels=...)`, the per-rank losses
all-gathered and weighted by their tokens, backward, optimizer step. Adapted to the run, and only so far as a
comparison needs it: the model is `ulab train`'s (the same config and seed, so the same weights: build_model), the
data are the packed rows `ulab train` wrote in its run directory (data/stage0.npz), the DeepSpeed config is the
run's (ZeRO stage, precision, clipping), the optimizer AdamW with the run's schedule (the example's Adam at 1e-5
would train another model), and the example's per-step `print(loss)` becomes a list read after the loop (no I/O
inside a timed step). Features on the plan (activation checkpointing, TiledMLP) are switched on as bench/bare_loop.py
does. The rows hold one document each (documents of seq_len - 1 bytes, plus EOS): the example has no packed-document
attention, so one document per row keeps both sides computing the same attention.

Each pair runs `ulab train` and the peer on the same ranks, the order swapped every pair. Per step: ours is the
trainer's `step_time_s` (metrics.jsonl, slowest rank), the peer's the slowest rank's loop time of that step; the
ratio printed is the median over pairs, and the loss difference the largest over pairs. The per-step figure over the
whole run (steps 2 to the end, callbacks included: stage_timings.jsonl `after_first_step_s`) is printed beside it.
CPU seconds of each step, summed over the ranks (ours: metrics.jsonl `cpu_time_s`; the peer's: `time.process_time`
around the same loop body), are printed beside the wall times: on a host other work shares, the wall time of a step
moves with that work's load from pair to pair, while the CPU seconds the step's work takes hardly do (they tell a
slower stack from an unlucky pair). Each pair's own ratios (medians over its steps 2 to the end) show the spread.

--profile-step K runs one more pair, counted in no figure above, in which each side profiles its K-th step on every
rank (torch.profiler: worker/trainer/step_profile.py, ULAB_TRAINER_PROFILE_STEP for ours; the same profiler around
the peer's loop body), and prints rank 0's ops side by side: calls and self time, the largest first.

Usage: .venv/bin/python bench/peer_alst.py [--seq-len 512] [--steps 8] [--pairs 6] [--zero-stage 2]
       [--profile-step K] [--json OUT.json]
       (2 CPU ranks, a tiny Llama, fp32; --cuda: both ranks share GPU 0 over gloo, bf16)
Prints figures; asserts nothing. Targets: ours at most 1.05x the peer's step, losses within 1e-5.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from worker.trainer.phases import PHASES  # noqa: E402  (the trainer's split of a step; the peer's is the same)
from worker.trainer.step_profile import PROFILE_STEP_ENV, profile_step, profiler, write_profile  # noqa: E402

TINY = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 688, "vocab_size": 4096, "max_position_embeddings": 8192}
TARGET_RATIO, TARGET_LOSS = 1.05, 1e-5


def peer_rank(plan: Path, run_dir: Path) -> None:
    """One rank of the peer (under torchrun): Accelerate's example loop on `ulab train`'s run directory."""
    import torch

    from bench.bare_loop import Setup

    s = Setup(plan, run_dir, document_attention=False)
    accelerator = s.accelerator
    if s.spec.grad_accum != 1:
        raise SystemExit("the peer runs grad_accum 1 (the example's loop has no accumulation)")
    # the example's one prepare call: the loader comes back wrapped in UlyssesSPDataLoaderAdapter
    model, optimizer, dl, scheduler = accelerator.prepare(s.model, s.optimizer, s.loader, s.scheduler)
    sp_size = s.parallelism_config.sp_size
    if sp_size > 1:
        from deepspeed.utils import groups

        sp_group = groups._get_sequence_parallel_group()
    unwrapped = accelerator.unwrap_model(model)
    model.train()
    losses, times, cpu, marks = [], [], [], []

    def mark():  # a point in the step: CUDA events (read after the loop, no sync inside it), else the clock
        if s.device != "cuda":
            return time.perf_counter()
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    batches = iter(dl)
    profiled, prof = profile_step(), None
    for k in range(s.stage.steps):
        if k + 1 == profiled:
            prof = profiler()
            prof.__enter__()
        t0, c0 = time.perf_counter(), time.process_time()
        optimizer.zero_grad()
        m0 = mark()
        batch = {k: v.to(s.on) for k, v in next(batches).items()}
        outputs = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False)
        shift_labels = batch["shift_labels"] if "shift_labels" in batch else torch.nn.functional.pad(
            batch["labels"][..., 1:], (0, 1), value=-100)
        loss = unwrapped.loss_function(logits=outputs.logits, labels=None, shift_labels=shift_labels,
                                       vocab_size=unwrapped.config.vocab_size)
        if sp_size > 1:  # the example's differentiable token-weighted aggregation over the SP group
            losses_per_rank = torch.distributed.nn.functional.all_gather(loss, group=sp_group)
            good_tokens = (shift_labels != -100).view(-1).sum()
            good_per_rank = torch.distributed.nn.functional.all_gather(good_tokens, group=sp_group)
            total = sum(losses_per_rank[r] * good_per_rank[r] for r in range(sp_size) if good_per_rank[r] > 0)
            loss = total / max(sum(good_per_rank), 1)
        m1 = mark()
        accelerator.backward(loss)
        m2 = mark()
        optimizer.step()
        scheduler.step()
        marks.append((m0, m1, m2, mark()))
        losses.append(loss.detach())
        if s.device == "cuda":
            torch.cuda.synchronize()  # the step's kernels, as the trainer's step clock waits for them
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        if prof is not None:
            prof.__exit__(None, None, None)
            write_profile(run_dir, k + 1, s.rank, prof)
            prof = None
    def seconds(a, b) -> float:
        return a.elapsed_time(b) / 1000 if s.device == "cuda" else b - a

    # per step: the step, then forward (with the loss), backward and optimizer as the trainer's phases split it
    table = [[t, seconds(m[0], m[1]), seconds(m[1], m[2]), seconds(m[2], m[3])] for t, m in zip(times, marks)]
    slowest = torch.tensor(table, dtype=torch.float64, device=s.on)
    torch.distributed.all_reduce(slowest, op=torch.distributed.ReduceOp.MAX)
    cpu_all = torch.tensor(cpu, dtype=torch.float64, device=s.on)
    torch.distributed.all_reduce(cpu_all)  # every rank's CPU seconds of the step, summed (ours: sum of cpu_time_s)
    if s.rank == 0:
        cols = slowest.cpu().T.tolist()
        (run_dir / "peer.json").write_text(json.dumps({
            "losses": [float(x) for x in torch.stack(losses).double().cpu()], "step_times": cols[0],
            "cpu_times": cpu_all.cpu().tolist(),
            **dict(zip(PHASES, cols[1:]))}))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def make_plan(data: Path, a: argparse.Namespace) -> dict:
    t = {"seq_len": a.seq_len, "micro_batch_size": 1, "grad_accum": 1, "dtype": "bf16" if a.cuda else "fp32",
         "zero_stage": a.zero_stage, "attn_implementation": "sdpa"}
    t.update(json.loads(a.features))
    return {"model": {"config": json.loads(a.model)},
            "hardware": {"gpu": "H100-80GB", "gpus_per_node": 2, "num_nodes": 1},
            "parallel": {"sp_size": 2, "dp_size": 1}, "training": t,
            "run": {"steps": a.steps, "learning_rate": 1e-3, "seed": 0, "data": {"path": str(data)},
                    "model_path": None, "checkpoint_every": 0}}


def env_for(a: argparse.Namespace, profile: bool = False) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "ULAB_TRAINER_SKIP_FINAL_SAVE": "1", "ULAB_TRAINER_SHARE_DEVICE": "1" if a.cuda else "0"}
    env.pop(PROFILE_STEP_ENV, None)
    if profile:
        env[PROFILE_STEP_ENV] = str(a.profile_step)
    return env


def run(cmd: list[str], env: dict[str, str], timeout: float) -> None:
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd[:4])}... exit {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}")


def profiled_ops(rd: Path, a: argparse.Namespace) -> dict:
    path = rd / "profile" / f"step{a.profile_step}-rank0.json"
    return json.loads(path.read_text()) if path.exists() else {}


def ours(tmp: Path, name: str, plan: Path, a: argparse.Namespace, profile: bool = False) -> dict:
    rd = tmp / name
    run([sys.executable, "-m", "worker.trainer", "--plan", str(plan), "--run-dir", str(rd)], env_for(a, profile),
        a.timeout)
    m = [json.loads(x) for x in (rd / "metrics.jsonl").read_text().splitlines() if x.strip()]
    timing = [json.loads(x) for x in (rd / "stage_timings.jsonl").read_text().splitlines()]
    return {"losses": [x["loss"] for x in m], "step_times": [x["step_time_s"] for x in m],
            "cpu_times": [sum(x["cpu_time_s"]) for x in m],
            **{k: [x.get(k) for x in m] for k in PHASES},
            "per_step_s": sum(t["after_first_step_s"] for t in timing) / (a.steps - 1), "data": rd / "data",
            "ops": profiled_ops(rd, a) if profile else {}}


def peer(tmp: Path, name: str, plan: Path, data: Path, a: argparse.Namespace, profile: bool = False) -> dict:
    rd = tmp / name
    rd.mkdir()
    (rd / "data").symlink_to(data)
    run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(Path(__file__)),
         "--rank", "--plan", str(plan), "--run-dir", str(rd)], env_for(a, profile), a.timeout)
    out = json.loads((rd / "peer.json").read_text())
    out["ops"] = profiled_ops(rd, a) if profile else {}
    out["per_step_s"] = sum(out["step_times"][1:]) / (a.steps - 1)
    return out


def compare(a: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="ulab-peer-") as t:
        tmp = Path(t)
        from bench.gpu_models import write_long_documents

        docs = write_long_documents(tmp / "docs.txt", doc_len=a.seq_len - 1, total=(a.steps + 2) * 2 * a.seq_len)
        plan = tmp / "plan.json"
        plan.write_text(json.dumps(make_plan(docs, a)))
        pairs = []
        data = None  # the rows `ulab train` wrote in the first pair's run directory: the peer reads the same
        for p in range(a.pairs):
            got = {}
            for side in ("ours", "peer") if p % 2 == 0 else ("peer", "ours"):
                if side == "ours":
                    got["ours"] = ours(tmp, f"ours-{p}", plan, a)
                    data = data or got["ours"]["data"]
                else:
                    got["peer"] = peer(tmp, f"peer-{p}", plan, data, a)
            pairs.append(got)
        ops = {}
        if a.profile_step:  # one more pair, in no figure: each side's profiled step
            got = {"ours": ours(tmp, "ours-profile", plan, a, profile=True)}
            got["peer"] = peer(tmp, "peer-profile", plan, data or got["ours"]["data"], a, profile=True)
            ops = {side: got[side]["ops"] for side in got}
    steps = []
    for k in range(a.steps):
        ratios = [x["ours"]["step_times"][k] / x["peer"]["step_times"][k] for x in pairs]
        diffs = [abs(x["ours"]["losses"][k] - x["peer"]["losses"][k]) / abs(x["ours"]["losses"][k]) for x in pairs]
        cpu_ratios = [x["ours"]["cpu_times"][k] / x["peer"]["cpu_times"][k] for x in pairs]
        steps.append({"step": k + 1, "ours_s": statistics.median(x["ours"]["step_times"][k] for x in pairs),
                      "peer_s": statistics.median(x["peer"]["step_times"][k] for x in pairs),
                      "ratio": statistics.median(ratios), "loss": pairs[0]["ours"]["losses"][k],
                      "ours_cpu_s": statistics.median(x["ours"]["cpu_times"][k] for x in pairs),
                      "peer_cpu_s": statistics.median(x["peer"]["cpu_times"][k] for x in pairs),
                      "cpu_ratio": statistics.median(cpu_ratios), "loss_rel_diff": max(diffs)})
    whole = statistics.median(x["ours"]["per_step_s"] / x["peer"]["per_step_s"] for x in pairs)
    later = [s["ratio"] for s in steps[1:]] or [steps[0]["ratio"]]
    first = 1 if a.steps > 1 else 0

    def pair_ratio(x: dict, key: str) -> float:  # one pair's median over its steps 2 to the end
        return statistics.median(o / p for o, p in zip(x["ours"][key][first:], x["peer"][key][first:]))
    phases = {side: {k: statistics.median(v for x in pairs for v in x[side][k][1:] if v is not None) for k in PHASES}
              for side in ("ours", "peer")}
    return {"seq_len": a.seq_len, "steps": steps, "pairs": len(pairs), "median_ratio": statistics.median(later),
            "median_cpu_ratio": statistics.median(s["cpu_ratio"] for s in steps[first:]),
            "pair_ratios": [pair_ratio(x, "step_times") for x in pairs],
            "pair_cpu_ratios": [pair_ratio(x, "cpu_times") for x in pairs],
            "whole_run_ratio": whole, "worst_loss_rel_diff": max(s["loss_rel_diff"] for s in steps),
            "phases_after_first": phases,
            "ours_per_step_s": statistics.median(x["ours"]["per_step_s"] for x in pairs),
            "peer_per_step_s": statistics.median(x["peer"]["per_step_s"] for x in pairs), "ops": ops}


def print_table(r: dict, a: argparse.Namespace) -> None:
    cfg = json.loads(a.model)
    print(f"ulab train vs Accelerate's ALST example (test_ds_alst_ulysses_sp.py, adapted): SP=2 on 2 "
          f"{'ranks sharing GPU 0' if a.cuda else 'CPU ranks'}, ZeRO-{a.zero_stage}, "
          f"{'bf16' if a.cuda else 'fp32'}, features {a.features}, seq_len {a.seq_len}, hidden {cfg['hidden_size']}, "
          f"{cfg['num_hidden_layers']} layers; {r['pairs']} alternated pairs, medians per step")
    print(f"  {'step':>4} {'ours ms':>9} {'peer ms':>9} {'ratio':>6} {'ours cpu ms':>11} {'peer cpu ms':>11} "
          f"{'cpu ratio':>9} {'loss':>10} {'loss rel. diff':>14}")
    for s in r["steps"]:
        print(f"  {s['step']:>4} {1000 * s['ours_s']:9.1f} {1000 * s['peer_s']:9.1f} {s['ratio']:6.3f} "
              f"{1000 * s['ours_cpu_s']:11.1f} {1000 * s['peer_cpu_s']:11.1f} {s['cpu_ratio']:9.3f} "
              f"{s['loss']:10.5f} {s['loss_rel_diff']:14.2e}")
    ok_ratio = r["median_ratio"] <= TARGET_RATIO
    ok_loss = r["worst_loss_rel_diff"] <= TARGET_LOSS
    print(f"median step ratio (steps 2-{a.steps}) {r['median_ratio']:.3f}x, target <= {TARGET_RATIO}: "
          f"{'OK' if ok_ratio else 'MISSED'}; whole run per step after step 1 (callbacks included): ours "
          f"{1000 * r['ours_per_step_s']:.1f} ms, peer {1000 * r['peer_per_step_s']:.1f} ms, "
          f"{r['whole_run_ratio']:.3f}x")
    print(f"CPU seconds of a step (all ranks), median ratio (steps 2-{a.steps}) {r['median_cpu_ratio']:.3f}x; "
          "per pair, wall / CPU: " + ", ".join(f"{w:.2f} / {c:.2f}"
                                               for w, c in zip(r["pair_ratios"], r["pair_cpu_ratios"])))
    print("medians after step 1, ms (forward with the loss / backward / optimizer): " + "; ".join(
        f"{side} " + " / ".join(f"{1000 * r['phases_after_first'][side][k]:.1f}" for k in PHASES)
        for side in ("ours", "peer")))
    print(f"largest relative loss difference {r['worst_loss_rel_diff']:.2e}, target <= {TARGET_LOSS:g}: "
          f"{'OK' if ok_loss else 'MISSED'}")


def print_ops(r: dict, a: argparse.Namespace, top: int = 20) -> None:
    """Rank 0's ops of the profiled step, side by side: calls and self time (device time on CUDA), largest first."""
    if not r["ops"]:
        return
    key = "self_device_us" if a.cuda else "self_cpu_us"
    mine, theirs = r["ops"]["ours"], r["ops"]["peer"]
    names = sorted(set(mine) | set(theirs), key=lambda n: -max(mine.get(n, {}).get(key, 0),
                                                                theirs.get(n, {}).get(key, 0)))
    print(f"step {a.profile_step} profiled on rank 0 (one more pair, in no figure above), self "
          f"{'device' if a.cuda else 'CPU'} time, largest first:")
    print(f"  {'op':<60} {'ours calls':>10} {'peer calls':>10} {'ours ms':>9} {'peer ms':>9}")
    for n in names[:top]:
        o, p = mine.get(n, {}), theirs.get(n, {})
        print(f"  {n[:60]:<60} {o.get('calls', 0):>10} {p.get('calls', 0):>10} {o.get(key, 0) / 1000:9.1f} "
              f"{p.get(key, 0) / 1000:9.1f}")
    total = {side: sum(v[key] for v in ops.values()) / 1000 for side, ops in r["ops"].items()}
    print(f"  self time of all ops: ours {total['ours']:.1f} ms, peer {total['peer']:.1f} ms")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)  # one peer rank, under torchrun
    ap.add_argument("--plan", type=Path)
    ap.add_argument("--run-dir", type=Path)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--zero-stage", type=int, default=2, choices=(2, 3))
    ap.add_argument("--features", default="{}", help='training fields as JSON, e.g. \'{"tiled_mlp": true}\'')
    ap.add_argument("--model", default=json.dumps(TINY), help="the model config as JSON")
    ap.add_argument("--cuda", action="store_true", help="both ranks on GPU 0 (gloo), bf16")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per launch")
    ap.add_argument("--profile-step", type=int, default=0, metavar="K",
                    help="one more pair in which each side profiles its K-th step (rank 0's ops are printed)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    a = ap.parse_args(argv)
    if a.rank:
        peer_rank(a.plan, a.run_dir)
        return
    r = compare(a)
    print_table(r, a)
    print_ops(r, a)
    if a.json:
        a.json.write_text(json.dumps(r, indent=1))


if __name__ == "__main__":
    main()
