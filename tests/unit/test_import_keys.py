"""The importer's key lists (plan/import_keys.py) against the installed DeepSpeed, Accelerate and Transformers: an
upgrade that adds or drops a key fails here instead of turning into a wrong warning."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from plan import import_keys as K


def _fields(model) -> set[str]:
    out = set()
    for name, f in model.model_fields.items():
        out.add(name)
        if f.alias:
            out.add(f.alias)
    return out


def test_deepspeed_blocks_match_its_config_models():
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.runtime.zero.offload_config import (
        DeepSpeedZeroOffloadOptimizerConfig,
        DeepSpeedZeroOffloadParamConfig,
    )

    assert K.DEEPSPEED_ZERO == _fields(DeepSpeedZeroConfig)
    assert K.DEEPSPEED_OFFLOAD_PARAM == _fields(DeepSpeedZeroOffloadParamConfig)
    assert K.DEEPSPEED_OFFLOAD_OPTIMIZER == _fields(DeepSpeedZeroOffloadOptimizerConfig)
    assert K.DEEPSPEED_BF16 == _fields(DeepSpeedBF16Config)
    assert K.DEEPSPEED_FP16 == _fields(DeepSpeedFP16Config)
    for model in (DeepSpeedZeroConfig, DeepSpeedBF16Config, DeepSpeedZeroOffloadParamConfig):
        assert model.model_config["extra"] == "forbid"  # why the importer calls their unknown keys errors


def test_every_deepspeed_top_level_key_is_a_string_deepspeed_reads():
    import deepspeed

    source = "\n".join(p.read_text() for p in Path(deepspeed.__file__).parent.rglob("*.py"))
    quoted = set(re.findall(r"""["']([a-z0-9_]+)["']""", source))
    assert K.DEEPSPEED_TOP <= quoted, sorted(K.DEEPSPEED_TOP - quoted)


def test_accelerate_keys_match_its_config_file_and_launcher():
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.commands.launch import launch_command_parser

    assert K.ACCELERATE_TOP == {f.name for f in dataclasses.fields(ClusterConfig)}
    groups = {g.title: {a.dest for a in g._group_actions} for g in launch_command_parser()._action_groups}
    assert K.ACCELERATE_DEEPSPEED == groups["DeepSpeed Arguments"]
    assert K.ACCELERATE_PARALLELISM == groups["ParallelismConfig Arguments"]


def test_trainer_fields_and_defaults_match_training_arguments():
    from transformers import TrainingArguments

    fields = {f.name: f for f in dataclasses.fields(TrainingArguments) if f.init}
    assert K.TRAINER_FIELDS == set(fields)
    for name, default in K.TRAINER_DEFAULTS.items():
        assert fields[name].default == default, name
