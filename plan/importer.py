"""A user's existing setup (a DeepSpeed config, a launch line, an Accelerate config, TrainingArguments) turned into a
plan, with what their libraries would really do with it said plainly.

Each value is read where DeepSpeed 0.19, Accelerate 1.15 and the Transformers 5.23 Trainer read it (the key lists
and their sources are in plan.import_keys):
- a key none of them reads is a warning that names it and what does that job instead;
- two sides that cannot both hold (a launcher asking for more GPUs than a node has, a DeepSpeed value the Trainer's
  argument contradicts) are an error naming both;
- a value left to "auto" or to a library default is listed in `defaults` with the value it takes.
The answer is `{"plan", "warnings", "errors", "defaults", "estimate"}`: the plan estimated at once.

Pure: reads no file and imports nothing outside plan/; the text it is given is parsed by plan.import_text.
"""
from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from . import catalog
from . import import_keys as K
from .errors import FieldError, error
from .estimator import estimate
from .import_text import InputError, Launch, parse_json, parse_launch, parse_yaml, typed_value
from .validation import validate

DEFAULT_GPU = "H100-80GB"
DEFAULT_GPUS_PER_NODE = 8
# Catalog models with the same architecture as names the guides use (config.json: hidden_size, layers, heads, KV
# heads, intermediate_size and vocab_size equal; Llama 3.1 changed only the RoPE scaling and the context window).
SAME_ARCHITECTURE = {"meta-llama/meta-llama-3-8b": "meta-llama/Llama-3.1-8B",
                     "meta-llama/meta-llama-3-8b-instruct": "meta-llama/Llama-3.1-8B",
                     "meta-llama/meta-llama-3-70b": "meta-llama/Llama-3.1-70B",
                     "meta-llama/meta-llama-3-70b-instruct": "meta-llama/Llama-3.1-70B"}
ULYSSES_INSTEAD = ("Ulysses is set by Accelerate's `parallelism_config.sp_size` (or DeepSpeed's "
                   "`sequence_parallel_size`)")
# What does the job of keys people put in a ds_config that DeepSpeed never reads.
INSTEAD = {
    "sequence_parallelism": ULYSSES_INSTEAD, "sequence_parallel": ULYSSES_INSTEAD, "ulysses": ULYSSES_INSTEAD,
    "sp_size": ULYSSES_INSTEAD, "sequence_parallel_degree": ULYSSES_INSTEAD,
    "gradient_checkpointing": "the Trainer's --gradient_checkpointing turns activation checkpointing on",
    "attn_implementation": "the model's attention is train.py's --attn_implementation (from_pretrained)",
    "max_seq_length": "the sequence length is train.py's (--max_seq_length)",
    "seq_len": "the sequence length is train.py's (--max_seq_length)",
    "use_liger_kernel": "the Trainer's --use_liger_kernel turns Liger on",
}
__all__ = ["InputError", "Launch", "import_setup", "parse_json", "parse_launch", "parse_yaml"]
SEQ_LEN_ARGS = ("max_seq_length", "max_length", "model_max_length", "seq_len", "seq_length", "block_size")
MODEL_ARGS = ("model_name_or_path", "model_name", "model_id", "model")
ATTN = ("flash_attention_2", "flash_attention_3", "sdpa", "flex_attention", "eager")


def _hint(key: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


@dataclass
class _Report:
    warnings: list[FieldError] = field(default_factory=list)
    errors: list[FieldError] = field(default_factory=list)
    defaults: list[FieldError] = field(default_factory=list)

    def pick(self, what: str, candidates: list[tuple[str, Any]]) -> Any:
        """The one value several sources give (label, value; None: not given); an error naming both sides of
        each disagreement."""
        given = [(label, v) for label, v in candidates if v is not None]
        for label, v in given[1:]:
            if v != given[0][1]:
                self.errors.append(error(label, f"{label}={v!r}, but {given[0][0]}={given[0][1]!r}: {what} can "
                                                f"only be one"))
        return given[0][1] if given else None


def _check_block(report: _Report, block: Any, path: str, known: frozenset[str]) -> dict:
    """A DeepSpeed block its pydantic model reads: unknown keys stop deepspeed.initialize (extra="forbid")."""
    if not isinstance(block, dict):
        if block is not None:
            report.errors.append(error(path, f"must be an object, got {block!r}"))
        return {}
    for key in block:
        if key not in known:
            report.errors.append(error(f"{path}.{key}", "DeepSpeed refuses this key (its config model forbids "
                                                       f"unknown keys): deepspeed.initialize stops{_hint(key, known)}"))
    return block


def _ds_keys(report: _Report, ds: dict, hf_mode: bool) -> None:
    for key, value in ds.items():
        if key in K.DEEPSPEED_TOP:
            continue
        instead = INSTEAD.get(key)
        inner = f" (its keys {', '.join(value)} are read by nothing)" if isinstance(value, dict) and value else ""
        what = "this block" if isinstance(value, dict) else "this key"
        report.warnings.append(error(key, f"DeepSpeed ignores {what}{inner}; "
                                          + (instead or f"no library reads it{_hint(key, K.DEEPSPEED_TOP)}")))
    if hf_mode and isinstance(ds.get("activation_checkpointing"), dict):
        report.warnings.append(error("activation_checkpointing", "this block configures deepspeed.checkpointing, "
                                     "which Transformers models never call; activation checkpointing is the "
                                     "Trainer's --gradient_checkpointing"))


def _offload(report: _Report, zero: dict, key: str, known: frozenset[str], legacy: str) -> bool | None:
    block = _check_block(report, zero.get(key), f"zero_optimization.{key}", known) if key in zero else None
    if block is None:
        return bool(zero[legacy]) if isinstance(zero.get(legacy), bool) else None
    device = str(block.get("device", "none"))
    if device == "nvme":
        report.warnings.append(error(f"zero_optimization.{key}.device", "nvme: the planner models CPU offload; "
                                     "the estimate counts these states in host memory, which NVMe spares"))
    return device in ("cpu", "nvme")


def _accel_offload(value: Any) -> bool | None:
    return None if value is None else str(value) in ("cpu", "nvme")


def _nested_unknown(report: _Report, block: Any, path: str, known: frozenset[str], what: str) -> dict:
    if not isinstance(block, dict):
        return {}
    for key in block:
        if key not in known:
            report.warnings.append(error(f"{path}.{key}", f"{what} reads no such key (ignored){_hint(key, known)}"))
    return block


def import_setup(ds_config: dict | None = None, launch: str | Launch | None = None,
                 accelerate_config: dict | None = None, training_args: dict | None = None, *,
                 gpu: Any = None, gpus_per_node: int | None = None, model_config: dict | None = None) -> dict:
    """The plan a setup describes, with its warnings, errors, defaults and estimate (see the module doc)."""
    r = _Report()
    ds = ds_config or {}
    acc = accelerate_config or {}
    run = parse_launch(launch) if isinstance(launch, str) else launch
    lo = run.options if run else {}
    # --- the Trainer's arguments: a TrainingArguments JSON and the launch line's script arguments ---
    hf: dict[str, tuple[str, Any]] = {}
    for key, value in (training_args or {}).items():
        if key not in K.TRAINER_FIELDS:
            hint = _hint(key, K.TRAINER_FIELDS)
            r.warnings.append(error(f"training_args.{key}", "not a TrainingArguments field: HfArgumentParser refuses "
                                                            f"it unless train.py declares it{hint}"))
        hf[key] = (f"training_args.{key}", value)
    for key, value in (run.script_args if run else {}).items():
        if key in hf and hf[key][1] != value:
            r.errors.append(error(f"--{key}", f"--{key}={value!r} on the launch line, but {hf[key][0]}="
                                              f"{hf[key][1]!r}"))
        hf[key] = (f"--{key}", value)
    hf_mode = training_args is not None or "deepspeed" in hf or any(k in K.TRAINER_DEFAULTS for k in hf)
    _ds_keys(r, ds, hf_mode)
    zero = _check_block(r, ds.get("zero_optimization"), "zero_optimization", K.DEEPSPEED_ZERO)
    bf16_block = _check_block(r, ds.get("bf16", ds.get("bfloat16")), "bf16", K.DEEPSPEED_BF16)
    fp16_block = _check_block(r, ds.get("fp16"), "fp16", K.DEEPSPEED_FP16)
    if acc:
        for key in acc:
            if key not in K.ACCELERATE_TOP:
                r.errors.append(error(key, "accelerate launch refuses this key (ClusterConfig.from_yaml_file: unknown "
                                           f"keys){_hint(key, K.ACCELERATE_TOP)}"))
    acc_ds = _nested_unknown(r, acc.get("deepspeed_config"), "deepspeed_config", K.ACCELERATE_DEEPSPEED,
                             "accelerate launch")
    acc_par = _nested_unknown(r, acc.get("parallelism_config"), "parallelism_config", K.ACCELERATE_PARALLELISM,
                              "accelerate launch")

    def hf_value(key: str) -> tuple[str, Any] | None:
        return hf.get(key)

    def trainer_matched(ds_key: str, ds_val: Any, hf_key: str) -> Any:
        """DeepSpeed's value as the Trainer checks it against its own argument (transformers/integrations/
        deepspeed.py HfTrainerDeepSpeedConfig.fill_match: "auto" takes the argument, a mismatch stops the run)."""
        given = hf_value(hf_key)
        default = K.TRAINER_DEFAULTS[hf_key]
        if ds_val == "auto":
            if given is None:
                r.defaults.append(error(ds_key, f'"auto" takes the Trainer\'s {hf_key}={default!r} (its default)'))
                return default
            return given[1]
        if ds_val is None:
            return given[1] if given is not None else None
        if given is not None and given[1] != ds_val:
            r.errors.append(error(ds_key, f"{ds_key}={ds_val!r} in the DeepSpeed config, but {given[0]}="
                                          f"{given[1]!r}: the Trainer stops on the mismatch"))
        elif given is None and hf_mode and default != ds_val:
            fix = f"--{hf_key}" if ds_val is True else f"--{hf_key} {ds_val}"
            r.warnings.append(error(ds_key, f"{ds_key}={ds_val!r} in the DeepSpeed config, but the launch passes no "
                                            f"--{hf_key} and the Trainer's default is {default!r}: the Trainer stops "
                                            f"on the mismatch unless train.py sets it; pass {fix}"))
        return ds_val

    # --- precision ---
    ds_bf16 = trainer_matched("bf16.enabled", bf16_block.get("enabled"), "bf16") if bf16_block or "bf16" in hf \
        else None
    ds_fp16 = trainer_matched("fp16.enabled", fp16_block.get("enabled"), "fp16") if fp16_block or "fp16" in hf \
        else None
    mixed = r.pick("the precision", [("mixed_precision", acc.get("mixed_precision")),
                                     ("--mixed_precision", lo.get("mixed_precision") if run and
                                      run.launcher == "accelerate" else None)])
    if ds_bf16 and ds_fp16:
        r.errors.append(error("bf16.enabled", "bf16.enabled and fp16.enabled are both on: DeepSpeed refuses both"))
    dtype = "bf16" if ds_bf16 else "fp16" if ds_fp16 else None
    if mixed is not None:
        dtype = r.pick("the precision", [("bf16.enabled/fp16.enabled", dtype),
                                         ("mixed_precision", {"bf16": "bf16", "fp16": "fp16"}.get(str(mixed), "fp32"))])
    if dtype is None:
        r.defaults.append(error("training.dtype", "nothing turns bf16 or fp16 on: fp32 (DeepSpeed's and the "
                                                  "Trainer's default)"))
        dtype = "fp32"
    # --- batch, accumulation, clipping ---
    micro = trainer_matched("train_micro_batch_size_per_gpu", ds.get("train_micro_batch_size_per_gpu"),
                            "per_device_train_batch_size")
    accum = r.pick("gradient_accumulation_steps", [
        ("gradient_accumulation_steps", trainer_matched("gradient_accumulation_steps",
                                                        ds.get("gradient_accumulation_steps"),
                                                        "gradient_accumulation_steps")),
        ("deepspeed_config.gradient_accumulation_steps", acc_ds.get("gradient_accumulation_steps"))])
    clip = r.pick("gradient clipping", [
        ("gradient_clipping", trainer_matched("gradient_clipping", ds.get("gradient_clipping"), "max_grad_norm")),
        ("deepspeed_config.gradient_clipping", acc_ds.get("gradient_clipping"))])
    for name, value, fallback in (("train_micro_batch_size_per_gpu", micro, K.TRAINER_DEFAULTS[
            "per_device_train_batch_size"] if hf_mode else 1), ("gradient_accumulation_steps", accum, 1),
                                  ("gradient_clipping", clip, 1.0 if hf_mode else 0.0)):
        if value is None:
            r.defaults.append(error(name, f"not set: {fallback!r} ("
                                          + ("the Trainer's default)" if hf_mode else "DeepSpeed's default)")))
    micro = micro if micro is not None else (K.TRAINER_DEFAULTS["per_device_train_batch_size"] if hf_mode else 1)
    accum = accum if accum is not None else 1
    clip = clip if clip is not None else (1.0 if hf_mode else 0.0)
    # --- ZeRO and offload ---
    stage = r.pick("the ZeRO stage", [("zero_optimization.stage", zero.get("stage")),
                                      ("deepspeed_config.zero_stage", acc_ds.get("zero_stage")),
                                      ("--zero_stage", lo.get("zero_stage"))])
    if stage is None:
        r.defaults.append(error("zero_optimization.stage", "not set: 0 (DeepSpeed's default)"))
        stage = 0
    off_opt = r.pick("the optimizer offload", [
        ("zero_optimization.offload_optimizer", _offload(r, zero, "offload_optimizer", K.DEEPSPEED_OFFLOAD_OPTIMIZER,
                                                         "cpu_offload")),
        ("deepspeed_config.offload_optimizer_device", _accel_offload(acc_ds.get("offload_optimizer_device")))])
    off_par = r.pick("the parameter offload", [
        ("zero_optimization.offload_param", _offload(r, zero, "offload_param", K.DEEPSPEED_OFFLOAD_PARAM,
                                                     "cpu_offload_param")),
        ("deepspeed_config.offload_param_device", _accel_offload(acc_ds.get("offload_param_device")))])
    # --- GPUs, nodes and sequence parallelism ---
    node_gpus = gpus_per_node
    if node_gpus is None:
        node_gpus = DEFAULT_GPUS_PER_NODE
        r.defaults.append(error("hardware.gpus_per_node", f"{node_gpus} GPUs per node (give the node's count)"))
    per_node, nodes, label = _layout(r, run, acc, node_gpus)
    sp = count(r, "sequence_parallel_size", r.pick("the sequence-parallel degree", [
        ("sequence_parallel_size", ds.get("sequence_parallel_size")),
        ("parallelism_config.parallelism_config_sp_size", acc_par.get("parallelism_config_sp_size")),
        ("--parallelism_config_sp_size", lo.get("parallelism_config_sp_size")),
    ]), 1)
    backend = acc_par.get("parallelism_config_sp_backend", lo.get("parallelism_config_sp_backend"))
    if sp > 1 and backend is not None and backend != "deepspeed":
        r.errors.append(error("parallelism_config.parallelism_config_sp_backend", f"{backend!r} with sp_size {sp}: "
                                                                                  "Accelerate runs Ulysses only with "
                                                                                  "sp_backend 'deepspeed'"))
    if per_node > node_gpus:
        flag = {"deepspeed": "--num_gpus", "torchrun": "--nproc_per_node"}.get(label, label)
        where = "on one node" if nodes == 1 else "per node"
        r.errors.append(error(flag, f"{flag}={per_node} {where}, but a node has {node_gpus} "
                                    f"(hardware.gpus_per_node); the plan spreads the "
                                    f"{per_node * nodes} ranks over {math.ceil(per_node * nodes / node_gpus)} nodes"))
        nodes, per_node = math.ceil(per_node * nodes / node_gpus), node_gpus
    world = per_node * nodes
    if world % sp:
        r.errors.append(error("sequence_parallel_size", f"sp_size {sp} does not divide the {world} ranks "
                                                        f"({label})"))
    dp = max(1, world // sp)
    tbs = ds.get("train_batch_size")
    if isinstance(tbs, int) and isinstance(micro, int) and isinstance(accum, int) and tbs != micro * accum * dp:
        r.errors.append(error("train_batch_size", f"train_batch_size={tbs}, but micro batch {micro} x accumulation "
                                                  f"{accum} x {dp} data-parallel ranks is {micro * accum * dp}: "
                                                  "DeepSpeed stops on the mismatch"))
    # --- model, sequence length, kernels ---
    model = _model(r, hf, model_config)
    seq = r.pick("the sequence length", [*[(f"--{k}", hf[k][1]) for k in SEQ_LEN_ARGS if k in hf],
                                         ("parallelism_config.parallelism_config_sp_seq_length",
                                          acc_par.get("parallelism_config_sp_seq_length"))])
    if seq is None:
        r.errors.append(error("training.seq_len", "nothing in the setup says the sequence length: pass train.py's "
                                                  "--max_seq_length"))
    attn = r.pick("the attention kernel", [
        ("--attn_implementation", hf["attn_implementation"][1] if "attn_implementation" in hf else None),
        ("parallelism_config.parallelism_config_sp_attn_implementation",
         acc_par.get("parallelism_config_sp_attn_implementation"))])
    if attn is None:
        attn = "sdpa"
        r.defaults.append(error("training.attn_implementation", "not set: sdpa (Transformers' default when the "
                                                                "model supports it)"))
    ckpt = r.pick("activation checkpointing", [(hf[k][0], hf[k][1]) for k in ("gradient_checkpointing",
                                                                             "activation_checkpointing") if k in hf])
    if ckpt is None:
        r.defaults.append(error("training.activation_checkpointing", "not set: off (the Trainer's default; "
                                                                     "--gradient_checkpointing turns it on)"))
    liger = hf["use_liger_kernel"][1] if "use_liger_kernel" in hf else False
    if gpu is None:
        gpu = DEFAULT_GPU
        r.defaults.append(error("hardware.gpu", f"{gpu} (give the GPU the job runs on)"))
    training: dict[str, Any] = {
        "micro_batch_size": micro, "grad_accum": accum, "dtype": dtype, "zero_stage": stage,
        "offload_optimizer": bool(off_opt), "offload_params": bool(off_par),
        "activation_checkpointing": bool(ckpt) if ckpt is None or isinstance(ckpt, bool) else ckpt,
        "attn_implementation": attn, "liger_kernel": liger,
        # a number as the plan's float; anything else as given, for the plan's own check to name
        "max_grad_norm": float(clip) if isinstance(clip, int | float) and not isinstance(clip, bool) else clip}
    if seq is not None:
        training["seq_len"] = seq
    data = {"model": model, "hardware": {"gpu": gpu, "gpus_per_node": per_node, "num_nodes": nodes},
            "parallel": {"sp_size": sp, "dp_size": dp}, "training": training}
    v = validate(data)
    r.errors += [e for e in v.errors if e not in r.errors]
    plan = v.plan.effective() if v.plan is not None else data
    return {"plan": plan, "warnings": r.warnings, "errors": r.errors, "defaults": r.defaults,
            "estimate": estimate(data)}


def count(r: _Report, field: str, value: Any, fallback: int) -> int:
    """A count of GPUs, nodes, processes or the SP degree: a whole number from 1 to 65536, else an error naming
    the field (and `fallback` for the rest of the import)."""
    if value is None:
        return fallback
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65536:
        r.errors.append(error(field, f"must be a whole number from 1 to 65536, got {value!r}"))
        return fallback
    return value


def _layout(r: _Report, run: Launch | None, acc: dict, node_gpus: int) -> tuple[int, int, str]:
    """(ranks per node, nodes, the option that said so) from the launcher and the Accelerate config."""
    o = run.options if run else {}
    launcher = run.launcher if run else None
    if launcher == "deepspeed":
        nodes = count(r, "--num_nodes", o.get("num_nodes"), 1)
        if o.get("num_gpus") is None:
            r.defaults.append(error("--num_gpus", f"not set: every GPU of the node ({node_gpus})"))
        return count(r, "--num_gpus", o.get("num_gpus"), node_gpus), nodes, "deepspeed"
    if launcher == "torchrun":
        per = o.get("nproc_per_node")
        per = node_gpus if per in ("gpu", "auto") else count(r, "--nproc_per_node", per, 1)
        nnodes = o.get("nnodes")
        if isinstance(nnodes, str) and ":" in nnodes:  # an elastic range min:max: the most nodes it may use
            nnodes = typed_value(nnodes.split(":")[-1])
        return per, count(r, "--nnodes", nnodes, 1), "torchrun"
    total = r.pick("the number of processes", [("--num_processes", o.get("num_processes")),
                                               ("num_processes", acc.get("num_processes"))])
    machines = count(r, "num_machines", r.pick("the number of machines", [
        ("--num_machines", o.get("num_machines")), ("num_machines", acc.get("num_machines"))]), 1)
    total = None if total is None else count(r, "num_processes", total, machines)
    if total is None:
        if launcher == "python":
            return 1, 1, "python"
        total = node_gpus * machines
        r.defaults.append(error("num_processes", f"not set: every GPU of each node ({total} in all)"))
    if total % machines:
        r.errors.append(error("num_processes", f"num_processes={total} does not split over num_machines={machines}"))
    return max(1, total // machines), machines, "num_processes"


def _model(r: _Report, hf: dict[str, tuple[str, Any]], model_config: dict | None) -> dict:
    if model_config is not None:
        return {"config": model_config}
    given = next((hf[k] for k in MODEL_ARGS if k in hf), None)
    if given is None:
        r.errors.append(error("model", "the setup names no model: pass --model_name_or_path or a config.json"))
        return {}
    label, name = given
    models = catalog.models()
    by_lower = {n.lower(): n for n in models}
    preset = by_lower.get(str(name).lower()) or SAME_ARCHITECTURE.get(str(name).lower())
    if preset is None:
        r.errors.append(error(label, f"{name} is not in the catalog ({', '.join(models)}): give its config.json"))
        return {"preset": str(name)}
    if preset.lower() != str(name).lower():
        r.defaults.append(error("model.preset", f"{name} is planned as {preset} (the same architecture)"))
    return {"preset": preset}
