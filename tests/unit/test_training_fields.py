"""The views of a plan (plan/validation.py `Spec`, the trainer's `RunSpec`) read the training fields through explicit,
typed properties (plan/training_fields.py) rather than a `__getattr__` that answers Any for any name."""
from __future__ import annotations

import pytest

from plan import validate
from plan.model import Training
from plan.training_fields import TrainingFields
from plan.validation import Spec
from tests.tiny import tiny_plan
from worker.trainer.spec import RunSpec


def test_every_training_field_has_its_property():
    missing = [name for name in Training.model_fields if not isinstance(getattr(TrainingFields, name, None), property)]
    assert missing == [], f"add these to plan/training_fields.py: {missing}"
    extra = [name for name, v in vars(TrainingFields).items() if isinstance(v, property)
             and name != "training_section" and name not in Training.model_fields]
    assert extra == list(TrainingFields.DERIVED)


@pytest.mark.parametrize(("training", "fused"), [
    ({"liger_kernel": False}, False),
    ({"liger_kernel": True, "zero_stage": 2}, True),
    ({"liger_kernel": True, "zero_stage": 3}, True),  # DeepSpeed gathers the lm_head weight Liger reads
    ({"liger_kernel": True, "zero_stage": 3, "tiled_logits_loss": True}, False),  # the tiled loss owns the head
])
def test_both_views_answer_when_liger_computes_the_loss(training, fused):
    data = {**tiny_plan(), "run": {"steps": 3, "data": {"path": "examples/data.txt"}}}
    data["training"] |= training
    assert validate(data).spec.liger_fused_loss is fused
    assert RunSpec.from_plan(data).liger_fused_loss is fused


@pytest.mark.parametrize("view", [Spec, RunSpec])
def test_the_views_read_through_without_getattr(view):
    assert "__getattr__" not in vars(view)
    assert issubclass(view, TrainingFields)


def test_spec_and_run_spec_answer_the_plans_values():
    data = {**tiny_plan(), "run": {"steps": 3, "data": {"path": "examples/data.txt"}}}
    data["training"] |= {"zero_stage": 3, "tiled_mlp": True, "document_len": 64}
    spec = validate(data).spec
    assert spec is not None
    run_spec = RunSpec.from_plan(data)
    for view in (spec, run_spec):
        assert (view.zero_stage, view.tiled_mlp, view.document_len, view.seq_len, view.dtype) == (3, True, 64, 512,
                                                                                                   "fp32")
        with pytest.raises(AttributeError):
            _ = view.not_a_field  # an unknown name is an error, not a lookup in the plan
    assert spec.with_(seq_len=1024).seq_len == 1024
