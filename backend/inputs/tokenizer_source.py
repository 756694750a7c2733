"""Where a run's tokenizer comes from, checked before any GPU is taken (approve, retry; one check of the approval
gate). The trainer loads it with `AutoTokenizer.from_pretrained(run.tokenizer or run.model_path)`
(worker/trainer/data.py). A checkpoint directory without tokenizer files loads as an empty tokenizer, and the run
then fails blaming its data ("holds 1 tokens"), so the files are checked here, naming the field to change.

Runs after model_source.resolve: `run.model_path` is then a checked directory or a cached hub id."""
from __future__ import annotations

import os
from pathlib import Path

from backend.core.errors import UserError
from backend.core.settings import Settings
from backend.inputs.model_source import hub_id_problem, local_candidate
from backend.inputs.paths import HUB_ID, resolve_allowed
from plan.model import TOKENIZER_FILES, Plan


def has_tokenizer(source: str) -> bool:
    """Whether a directory, or a hub id in Transformers' cache, holds a tokenizer's files (neither: False)."""
    if os.path.isdir(source):
        return any((Path(source) / name).is_file() for name in TOKENIZER_FILES)
    if hub_id_problem(source):
        return False
    from huggingface_hub import try_to_load_from_cache

    return any(isinstance(try_to_load_from_cache(source, name), str) for name in TOKENIZER_FILES)


def check_tokenizer(plan: Plan, settings: Settings) -> Plan:
    """422 naming `run.tokenizer` (or `run.model_path` when the tokenizer is the checkpoint's) when the trainer would
    find no tokenizer; a local `run.tokenizer` is rewritten to its checked absolute path. A run with random weights
    and no `run.tokenizer` uses the built-in byte tokenizer: nothing to check. Answers the plan (itself when nothing
    changes)."""
    run = plan.run
    if run is None:
        raise UserError(422, "run", "missing: a run needs a run section")
    given = run.tokenizer
    if given:
        source = given
        directory = local_candidate(given, settings)  # looked up as run.model_path is: here, then the models root
        if directory is not None or not HUB_ID.match(given):
            source = resolve_allowed(str(directory or given), "run.tokenizer", settings)
            if not os.path.isdir(source):
                raise UserError(422, "run.tokenizer", f"{given[:200]} is not a directory")
        elif (problem := hub_id_problem(given)):
            raise UserError(422, "run.tokenizer", f"{given[:200]} is neither a directory nor a Hugging Face id "
                                                  f"(org/name): {problem}")
        if not has_tokenizer(source):
            raise UserError(422, "run.tokenizer", f"{given} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}"
                                                  "; a hub id must be downloaded)")
        if source == given:
            return plan
        return plan.model_copy(update={"run": run.model_copy(update={"tokenizer": source})})
    model_path = run.model_path
    if model_path and not has_tokenizer(model_path):
        raise UserError(422, "run.model_path", f"{model_path} holds no tokenizer files (none of "
                                               f"{', '.join(TOKENIZER_FILES)}): save the tokenizer beside the weights "
                                               "(tokenizer.save_pretrained), or name one in run.tokenizer")
    return plan
