"""A tiny Llama plan (4 heads, CPU, fp32) and a text corpus, for runs that train in seconds on 2 CPU ranks."""
from __future__ import annotations

import json
import time
from pathlib import Path

import httpx

WORDS = ("the quick brown fox jumps over the lazy dog while sequence parallel ranks trade heads for tokens "
         "and every step the loss goes down a little").split()
TERMINAL = {"succeeded", "failed", "oom", "cancelled", "lost", "stopped"}


def write_corpus(path: Path, lines: int = 4000) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for i in range(lines):
            f.write(" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(12)) + ".\n")
    return path


# The tiny Llama every CPU test trains or plans with: 4 heads (SP up to 4), 2 layers, a 512-token vocabulary.
TINY_LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 2048}


def tiny_plan(sp_size: int = 2, seq_len: int = 512, dp_size: int = 1, num_nodes: int = 1, **training) -> dict:
    """A fresh plan of the tiny Llama on CPU ranks (fp32, ZeRO-2, sdpa, no offload), `training` fields changed;
    sp_size * dp_size ranks spread over `num_nodes` nodes."""
    plan = {
        "model": {"config": dict(TINY_LLAMA)},
        "hardware": {"gpu": "H100-80GB", "gpus_per_node": sp_size * dp_size // num_nodes, "num_nodes": num_nodes},
        "parallel": {"sp_size": sp_size, "dp_size": dp_size},
        "training": {"seq_len": seq_len, "micro_batch_size": 1, "grad_accum": 1, "dtype": "fp32", "zero_stage": 2,
                     "offload_optimizer": False, "offload_params": False, "activation_checkpointing": False,
                     "checkpoint_offload": False, "tiled_mlp": False, "tiled_logits_loss": False,
                     "attn_implementation": "sdpa"},
    }
    plan["training"].update(training)
    return plan


def submit(client: httpx.Client, plan: dict, run: dict, name: str = "tiny", approve: bool = True) -> dict:
    """Store the plan, submit a run from it and (by default) approve it, through the API."""
    r = client.post("/api/plans", json={"name": name, **plan})
    assert r.status_code == 201, r.text
    r = client.post("/api/runs", json={"plan_id": r.json()["id"], "name": name, "run": run})
    assert r.status_code == 201, r.text
    run_out = r.json()
    assert run_out["state"] == "pending_approval"
    if approve:
        r = client.post(f"/api/runs/{run_out['id']}/approve")
        assert r.status_code == 200, r.text
        run_out = r.json()
    return run_out


def wait_for(client: httpx.Client, run_id: int, states: set[str], timeout_s: float) -> dict:
    end = time.monotonic() + timeout_s
    run = {}
    while time.monotonic() < end:
        run = client.get(f"/api/runs/{run_id}").json()
        if run["state"] in states:
            return run
        if run["state"] in TERMINAL:
            raise AssertionError(f"run {run_id} ended {run['state']}, waiting for {states}: {run.get('exit_reason')}")
        time.sleep(0.5)
    raise TimeoutError(f"run {run_id} still {run.get('state')} after {timeout_s}s, waiting for {states}")


def environ(pid: int) -> dict[str, str]:
    """A process's environment as it started (/proc/PID/environ)."""
    raw = (Path("/proc") / str(pid) / "environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def trainer_pids(run_dir: str) -> list[int]:
    """Processes whose command line names this run's directory (torchrun and its ranks)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if run_dir.encode() in (d / "cmdline").read_bytes():
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


def write_run_plan(folder: Path, steps: int, sp_size: int = 2) -> Path:
    """FOLDER/plan.json: the tiny plan with a run of `steps` steps (lr 1e-3, seed 0, no checkpoints) on the corpus
    written beside it (FOLDER/tiny.txt); the benches that train the tiny model start from it."""
    corpus = write_corpus(folder / "tiny.txt")
    run = {"steps": steps, "learning_rate": 1e-3, "seed": 0, "checkpoint_every": 0, "data": {"path": str(corpus)},
           "model_path": None}
    plan = tiny_plan(sp_size=sp_size) | {"run": run}
    path = folder / "plan.json"
    path.write_text(json.dumps(plan))
    return path
