"""Where a run's weights come from, checked before any GPU is taken (submit, approve, retry).

A plan names its architecture (`model.preset` or `model.config`); the trainer loads weights from `run.model_path`
with Transformers' `from_pretrained`. This module turns what the user gave into a loading path and checks it:

- `run.model_path` a directory (absolute, relative, or a name under the models root `ULAB_MODELS_DIR`): it must
  hold a config.json whose architecture is the plan's.
- `run.model_path` a Hugging Face id (`org/name`) with no such directory: Transformers loads it from its cache
  (the worker may run with `HF_HUB_OFFLINE=1`), so the cache must already hold its config.json.
- `run.model_path` absent with `model.preset`: the preset's name is looked up the same way (first
  `ULAB_MODELS_DIR/<org>/<name>`, then the hub cache) and written into the stored spec, so the trainer loads it.
- `run.model_path` absent with `model.config`: random weights built from the config (tests, CPU); nothing to check.

A submitted run may name a hub id that is not cached yet (it can be downloaded before approval); approval and
retry are strict: the checkpoint must be there.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from backend.core.errors import UserError
from backend.core.settings import Settings
from backend.inputs.paths import HUB_ID, check_path_length, expand_user, resolve_allowed
from plan import catalog
from plan.model import Plan

FIELD = "run.model_path"
# The architecture numbers that must agree between the plan and the checkpoint's config.json: any difference
# means the planner estimated another model than the one that would train.
ARCHITECTURE = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "vocab_size")


def hub_id_problem(name: str) -> str | None:
    """Why `name` is not a Hugging Face repo id, in huggingface_hub's own words (its validator), or None."""
    if not HUB_ID.match(name):
        return "not of the form org/name"
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError as e:
        return str(e)
    return None


def cached_hub_config(repo_id: str) -> str | None:
    """The cached config.json of a hub id (Transformers' cache, where an offline worker loads from), or None."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json")
    return found if isinstance(found, str) else None


def local_candidate(name: str, settings: Settings) -> Path | None:
    """The directory a name refers to: the path itself if it exists, else the same name under the models root."""
    given = expand_user(name, FIELD)
    if given.is_absolute() or name.startswith("."):
        return given
    if given.exists():
        return given
    under_root = settings.resolved_models_dir / name
    return under_root if under_root.exists() else None


def resolve(plan: Plan, settings: Settings, strict: bool) -> Plan:
    """The plan with `run.model_path` set to the checked loading path (an absolute directory or a cached hub id),
    its architecture checked against the plan's; 422 naming run.model_path otherwise. The plan itself when nothing
    changes."""
    if plan.run is None:
        raise UserError(422, "run", "missing: a run needs a run section")
    given = plan.run.model_path
    preset = plan.model.preset
    if not given and not preset:
        return plan  # model.config with random weights
    name = str(given or preset)
    if "\x00" in name:
        raise UserError(422, FIELD, "the path contains a NUL byte")
    check_path_length(name, FIELD)
    directory = local_candidate(name, settings)
    if directory is not None:
        path = resolve_allowed(str(directory), FIELD, settings)
        config_file = Path(path) / "config.json"
        if not config_file.is_file():
            raise UserError(422, FIELD, f"{path} has no config.json (a directory saved with "
                                        "save_pretrained or downloaded from the hub)")
        check_architecture(plan, config_file)
        return with_model_path(plan, path)
    problem = hub_id_problem(name)
    if problem:
        raise UserError(422, FIELD, f"{name[:200]} is neither a directory nor a Hugging Face id (org/name): {problem}")
    cached = cached_hub_config(name)
    if cached is not None:
        check_architecture(plan, Path(cached))
        return with_model_path(plan, name)
    if given and not strict:
        return plan  # a hub id that may be downloaded before approval
    where = f"{settings.resolved_models_dir / name} or the Hugging Face cache ({hub_cache_dir()})"
    what = f"model.preset {name} has no checkpoint" if not given else f"{name} is not downloaded"
    raise UserError(422, FIELD, f"{what}: looked in {where}. Save or download it there (huggingface-cli download "
                                f"{name} --local-dir {settings.resolved_models_dir / name}), or set run.model_path "
                                "to a checkpoint directory")


def with_model_path(plan: Plan, path: str) -> Plan:
    """The plan with `run.model_path` set (the plan itself when it already has it)."""
    assert plan.run is not None  # resolve refused a plan without one
    if plan.run.model_path == path:
        return plan
    return plan.model_copy(update={"run": plan.run.model_copy(update={"model_path": path})})


def hub_cache_dir() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def check_architecture(plan: Plan, config_file: Path) -> None:
    """422 naming run.model_path and the first config.json key whose value is not the plan's."""
    try:
        loaded = json.loads(config_file.read_text())
        have = catalog.model_from_config(loaded)
    except (OSError, ValueError) as e:
        raise UserError(422, FIELD, f"{config_file} is not a readable Hugging Face config.json: {e}") from None
    model = plan.model
    want = catalog.model_from_config(model.config) if model.config else catalog.models()[str(model.preset)]
    source = "model.config" if model.config else f"model.preset {model.preset}"
    for key in ARCHITECTURE:
        if getattr(have, key) != getattr(want, key):
            raise UserError(422, FIELD, f"the checkpoint's config.json has {key}={getattr(have, key)!r} but the "
                                        f"plan ({source}) has {key}={getattr(want, key)!r}: {config_file.parent} is "
                                        "another model than the one planned")


def check_data(plan: Plan) -> None:
    """The data path (already checked against the allowed roots at submit) must still exist."""
    if plan.run is None:
        raise UserError(422, "run", "missing: a run needs a run section with its data")
    path = plan.run.data.path
    if not os.path.exists(path):
        raise UserError(422, "run.data.path", f"{path} does not exist")
