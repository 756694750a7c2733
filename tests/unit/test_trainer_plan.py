"""Plan validation before any rank starts: each error names the field; `ulab train` prints one line, exit 2."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiny import tiny_plan
from worker.trainer.spec import PlanError, RunSpec

ULAB = Path(sys.executable).parent / "ulab"

GOOD = {**tiny_plan(sp_size=2, seq_len=512),
        "run": {"steps": 8, "learning_rate": 1e-3, "seed": 0, "data": {"path": "data.txt"}, "model_path": None}}


def with_(path: str, value):
    plan = copy.deepcopy(GOOD)
    *parents, last = path.split(".")
    node = plan
    for p in parents:
        node = node[p]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return plan


_DELETE = object()


def test_good_plan_parses():
    spec = RunSpec.from_plan(GOOD)
    assert spec.world_size == 2
    assert spec.total_steps == 8
    assert spec.stages[0].seq_len == 512


def test_stages_replace_seq_len_and_steps():
    spec = RunSpec.from_plan(with_("run.stages", [{"seq_len": 256, "steps": 3}, {"seq_len": 512, "steps": 2}]))
    assert [(s.seq_len, s.steps) for s in spec.stages] == [(256, 3), (512, 2)]
    assert spec.total_steps == 5
    assert spec.stage_at(4) == (1, 1)
    assert spec.stage_at(5) == (2, 0)


@pytest.mark.parametrize("path,value,field", [
    ("training.seq_len", 511, "training.seq_len"),
    ("model.config.num_attention_heads", 3, "parallel.sp_size"),
    ("hardware.gpus_per_node", 4, "parallel.dp_size"),  # the world size rule names dp_size (as the planner)
    ("training.attn_implementation", "eager", "training.attn_implementation"),
    ("training.dtype", "int8", "training.dtype"),
    ("training.zero_stage", 4, "training.zero_stage"),
    ("run.data", _DELETE, "run.data"),
    ("run.data.path", _DELETE, "run.data.path"),
    ("training.zero_stag", 1, "training.zero_stag"),
    ("run.steps", 0, "run.steps"),
    ("run", _DELETE, "run"),
    ("run.stages", [{"seq_len": 255, "steps": 1}], "run.stages[0].seq_len"),
])
def test_bad_plans_name_the_field(path, value, field):
    with pytest.raises(PlanError) as e:
        RunSpec.from_plan(with_(path, value))
    assert str(e.value).startswith(field), str(e.value)


def test_a_preset_plan_without_weights_is_valid_and_its_checkpoint_is_checked_where_it_loads(tmp_path, monkeypatch):
    """Planning, exports and the dry run never need the weights: the preset's checkpoint is looked up by
    the trainer (ULAB_MODELS_DIR/<preset>, else the hub cache), and a missing one names run.model_path."""
    from plan.exports import exports
    from plan.launch import dry_run
    from worker.trainer.spec import check_model_source

    plan = with_("model", {"preset": "Qwen/Qwen3-4B"})
    spec = RunSpec.from_plan(plan)
    assert exports(plan)["valid"]
    assert dry_run(plan, cuda=False)["plan"]["model"] == {"preset": "Qwen/Qwen3-4B"}
    monkeypatch.setenv("ULAB_MODELS_DIR", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # an empty cache
    assert spec.model_path == "Qwen/Qwen3-4B"  # not under the models root: a hub id
    with pytest.raises(PlanError) as e:
        check_model_source(spec)
    assert str(e.value).startswith("run.model_path: Qwen/Qwen3-4B is not downloaded"), str(e.value)
    (tmp_path / "Qwen" / "Qwen3-4B").mkdir(parents=True)
    assert spec.model_path == str(tmp_path / "Qwen" / "Qwen3-4B")
    with pytest.raises(PlanError, match="run.model_path: .* has no config.json"):
        check_model_source(spec)
    (tmp_path / "Qwen" / "Qwen3-4B" / "config.json").write_text("{}")
    with pytest.raises(PlanError, match="run.model_path: .* holds no tokenizer files"):  # checked here too
        check_model_source(spec)
    (tmp_path / "Qwen" / "Qwen3-4B" / "tokenizer.json").write_text("{}")
    check_model_source(spec)


def _ulab_train(tmp_path, plan: dict | str, data: str | None = "x " * 2000):
    p = tmp_path / "plan.json"
    p.write_text(plan if isinstance(plan, str) else json.dumps(plan))
    if data is not None:
        (tmp_path / "data.txt").write_text(data)
    return subprocess.run([str(ULAB), "train", "--plan", str(p), "--run-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)


def test_rules_that_depend_on_the_machine_name_the_field():
    liger = RunSpec.from_plan(with_("training.liger_kernel", True))  # a valid plan, for a GPU
    liger.check_device(cuda=True)
    with pytest.raises(PlanError, match=r"^training\.liger_kernel: .*CUDA"):
        liger.check_device(cuda=False)
    flex = RunSpec.from_plan(with_("training.attn_implementation", "flex_attention"))
    flex.check_device(cuda=False)  # CPU ranks run sdpa
    with pytest.raises(PlanError, match=r"^training\.attn_implementation: flex_attention under Ulysses"):
        flex.check_device(cuda=True)


@pytest.mark.parametrize("plan,data,needle", [
    (with_("training.seq_len", 511), "x " * 2000, "seq_len"),
    (with_("training.liger_kernel", True), "x " * 2000, "training.liger_kernel: "),  # refused on a CPU machine
    ("{not json", "x", "not valid JSON"),
    (GOOD, None, "does not exist"),
    (GOOD, "", "is empty"),
    (GOOD, "short", "too short for one sequence"),
])
def test_ulab_train_fails_before_any_rank_with_one_line(tmp_path, plan, data, needle):
    proc = _ulab_train(tmp_path, plan, data)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0], proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_flash_attention_kernel_the_machine_lacks_fails_at_the_start_naming_the_field():
    """No flash-attn here: on a CUDA machine without it the run stops before any rank builds the model (and the dry
    run says so), instead of Transformers' ImportError mid-run; CPU ranks run sdpa whatever the plan says."""
    import importlib.util

    assert importlib.util.find_spec("flash_attn") is None
    for kernel, package in (("flash_attention_2", "flash-attn"), ("flash_attention_3", "flash-attn-3")):
        spec = RunSpec.from_plan(with_("training.attn_implementation", kernel))
        assert spec.depends_on_device  # so `ulab train` checks it before starting the ranks (cli.validate)
        spec.check_device(cuda=False)
        with pytest.raises(PlanError, match=rf"^training\.attn_implementation: {kernel} needs the {package}"):
            spec.check_device(cuda=True)
        with pytest.raises(PlanError, match=r"^training\.attn_implementation: "):
            spec.check_attention(cuda=True)  # what `ulab train --dry-run` runs
    RunSpec.from_plan(GOOD).check_device(cuda=True)  # sdpa needs nothing


@pytest.mark.parametrize("expandable,env,want", [
    (True, None, "expandable_segments:True"),
    (True, "max_split_size_mb:128", "max_split_size_mb:128,expandable_segments:True"),
    (True, "expandable_segments:False,roundup_power2_divisions:4",
     "roundup_power2_divisions:4,expandable_segments:True"),
    (False, None, None),
    (False, "max_split_size_mb:128", "max_split_size_mb:128"),  # the environment's own setting stays
])
def test_expandable_segments_set_the_allocator_config_of_the_ranks(monkeypatch, expandable, env, want):
    from worker.trainer.preflight import set_alloc_conf

    if env is None:
        monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    else:
        monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", env)
    set_alloc_conf(RunSpec.from_plan(with_("training.expandable_segments", expandable)))
    import os

    assert os.environ.get("PYTORCH_CUDA_ALLOC_CONF") == want
