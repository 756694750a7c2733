"""What a run spec may ask for: paths only under the allowed roots, sizes within bounds. The launch path
has no shell anywhere (argument lists only), so a path is only ever a file name, never a command."""
from __future__ import annotations

import os
import re
from pathlib import Path

from backend.core.errors import UserError
from backend.core.settings import Settings
from plan.model import Plan, RunSection

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}$")
NAME_MAX = 255  # bytes in one path part (Linux NAME_MAX); the system refuses longer ones with ENAMETOOLONG
PATH_MAX = 4096


def check_path_length(path: str, field: str) -> None:
    """422 naming the field for a path the system would refuse as too long (a part over 255 bytes, or the whole
    over 4096), before anything asks the file system about it."""
    if len(path.encode("utf-8", "surrogatepass")) >= PATH_MAX:
        raise UserError(422, field, f"the path is longer than {PATH_MAX} bytes")
    for part in path.split("/"):
        if len(part.encode("utf-8", "surrogatepass")) > NAME_MAX:
            raise UserError(422, field, f"a part of the path ({part[:40]}...) is longer than {NAME_MAX} bytes")


def expand_user(path: str, field: str) -> Path:
    """`~` and `~user` expanded; 422 naming the field for a user with no home directory here."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        raise UserError(422, field, f"{path[:80]}: {path.split('/')[0][:40]} names no user's home directory") from None


def resolve_allowed(path: str, field: str, settings: Settings) -> str:
    """The absolute, symlink-free path if it lies under an allowed root; else a 422 naming the field."""
    if "\x00" in path:
        raise UserError(422, field, "the path contains a NUL byte")
    check_path_length(path, field)
    given = expand_user(path, field)
    resolved = Path(os.path.realpath(given if given.is_absolute() else Path.cwd() / given))
    roots = settings.resolved_allowed_roots
    if not any(resolved == root or resolved.is_relative_to(root) for root in roots):
        raise UserError(422, field, f"{path} is outside the allowed roots ({', '.join(map(str, roots))}); "
                                    "set ULAB_ALLOWED_ROOTS to add one")
    return str(resolved)


def check_paths(run: RunSection, settings: Settings) -> RunSection:
    """The run section with its paths as checked absolute, symlink-free paths (422 naming the field if one is
    outside the allowed roots; a hub id stays as it is). Runs at submit, and again when a worker claims the run
    (transitions.claim): a path that did not exist at submit may have become a symlink out of the roots since."""
    checked: dict[str, object] = {"data": run.data.model_copy(update={
        "path": resolve_allowed(run.data.path, "run.data.path", settings)})}
    for field in ("model_path", "tokenizer"):
        path = getattr(run, field)
        if path:
            local = Path(path).is_absolute() or path.startswith(".") or os.path.exists(path)
            if local or not HUB_ID.match(path):
                checked[field] = resolve_allowed(path, f"run.{field}", settings)
    return run.model_copy(update=checked)


def refused_paths(plan: Plan, settings: Settings) -> str | None:
    """Why a stored run's paths are no longer allowed ("field: reason"), or None; the stored plan is left as it is."""
    if plan.run is None:
        return None  # no run section, so no path
    try:
        check_paths(plan.run, settings)
    except UserError as e:
        return "; ".join(f"{d['field']}: {d['message']}" for d in e.detail)
    return None


def check_run_spec(plan: Plan, settings: Settings) -> dict:
    """The validated plan as the run spec to store (`plan.effective()`), its paths rewritten to checked absolute
    paths; the size bounds enforced."""
    if plan.run is None:
        raise UserError(422, "run", "missing: a run needs a run section")
    spec = plan.model_copy(update={"run": check_paths(plan.run, settings)}).effective()  # its paths rewritten
    check_limits(plan, settings)
    return spec


def check_limits(plan: Plan, settings: Settings) -> None:
    """The size bounds of anything that runs on the GPUs, a run or a probe (422 naming the field): its steps (the
    training stages'; a passkey test or a probe has none), sequence length and GPU count."""
    steps = plan.total_steps() if plan.run is not None else 0
    if steps > settings.max_steps:
        raise UserError(422, "run.steps", f"{steps} steps is above the limit of {settings.max_steps}")
    seq_lens = [plan.training.seq_len] + [s.seq_len for s in (plan.run.stages if plan.run else None) or []]
    if max(seq_lens) > settings.max_seq_len:
        raise UserError(422, "training.seq_len",
                        f"seq_len {max(seq_lens)} is above the limit of {settings.max_seq_len}")
    gpus = plan.hardware.gpus_per_node * plan.hardware.num_nodes
    if gpus > settings.max_gpus:
        raise UserError(422, "hardware.gpus_per_node", f"{gpus} GPUs is above the limit of {settings.max_gpus}")
