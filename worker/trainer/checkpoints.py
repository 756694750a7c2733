"""Checkpoints on disk: finding the newest, recording the layout that wrote it, and refusing a resume that
DeepSpeed cannot load.

ZeRO saves each rank's shard of the optimizer states (and, at stage 3, of the parameters) in its own file; a run
with another number of ranks cannot load them (DeepSpeed refuses ZeRO-3, and ZeRO-1/2 would re-split wrongly).
DeepSpeed's universal checkpoint (ds_to_universal + `load_universal`) converts between layouts but is not wired
into this trainer yet, so a resume whose world size differs stops before any rank starts, naming the field.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

LAYOUT_FILE = "ulab_layout.json"
# A checkpoint as a run names it (`run.resume_from`, `--resume-from`): relative to RUN_DIR/checkpoints
CHECKPOINT_REF = re.compile(r"^stage(\d{1,4})/checkpoint-(\d{1,12})$")
DISCARDED_DIR = "checkpoints-discarded"


def discard_newer(run_dir: Path, ref: str, attempt: int) -> list[Path]:
    """Make the checkpoint `ref` (stage<i>/checkpoint-<k>) the newest, so --resume continues from it: every newer
    checkpoint is moved (not deleted) to RUN_DIR/checkpoints-discarded/attempt-<attempt>/. Answers where they went.
    Raises ValueError naming --resume-from when `ref` is malformed or not a complete checkpoint. Call it with the run
    directory's lock held (the launcher), so no rank is writing checkpoints meanwhile."""
    m = CHECKPOINT_REF.match(ref)
    if m is None:
        raise ValueError(f"--resume-from: {ref[:100]!r} is not stage<i>/checkpoint-<step>")
    chosen = Path(run_dir) / "checkpoints" / ref
    if not (chosen / "trainer_state.json").is_file():
        raise ValueError(f"--resume-from: {chosen} is not a complete checkpoint (no trainer_state.json)")
    key = (int(m.group(1)), int(m.group(2)))
    moved = []
    for ck in sorted(Path(run_dir).glob("checkpoints/stage*/checkpoint-*")):
        found = CHECKPOINT_REF.match(f"{ck.parent.name}/{ck.name}")
        if found and (int(found.group(1)), int(found.group(2))) > key:
            dest = Path(run_dir) / DISCARDED_DIR / f"attempt-{attempt}" / ck.parent.name / ck.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            ck.rename(dest)
            moved.append(dest)
    return moved


def latest_checkpoint(run_dir: Path):
    """(stage index, checkpoint dir, steps done inside the stage) of the newest complete checkpoint, or None."""
    best = None
    for state in Path(run_dir).glob("checkpoints/stage*/checkpoint-*/trainer_state.json"):
        ck = state.parent
        found = re.search(r"stage(\d+)", ck.parent.name)
        if found is None:
            continue
        stage, k = int(found.group(1)), int(ck.name.rsplit("-", 1)[1])
        if best is None or (stage, k) > best[0]:
            best = ((stage, k), ck)
    if best is None:
        return None
    (stage, k), ck = best
    return stage, ck, k


def layout_of(spec) -> dict:
    return {"world_size": spec.world_size, "sp_size": spec.sp_size, "dp_size": spec.dp_size,
            "zero_stage": spec.zero_stage, "micro_batch_size": spec.micro_batch_size, "grad_accum": spec.grad_accum}


def write_layout(checkpoint_dir: Path, spec) -> None:
    Path(checkpoint_dir, LAYOUT_FILE).write_text(json.dumps(layout_of(spec)))


def saved_world_size(checkpoint_dir: Path) -> tuple[int | None, dict]:
    """The number of ranks that wrote a checkpoint: from its layout file, else from DeepSpeed's per-rank ZeRO
    shard files (`*zero_pp_rank_R_mp_rank_00_optim_states.pt`); None when neither tells (ZeRO stage 0)."""
    f = Path(checkpoint_dir, LAYOUT_FILE)
    if f.exists():
        layout = json.loads(f.read_text())
        return int(layout["world_size"]), layout
    ranks = {int(m.group(1)) for p in Path(checkpoint_dir).glob("global_step*/*zero_pp_rank_*_optim_states.pt")
             if (m := re.search(r"zero_pp_rank_(\d+)_", p.name))}
    return (max(ranks) + 1 if ranks else None), {}


def resume_problem(run_dir: Path, spec) -> str | None:
    """Why `--resume` cannot continue from the newest checkpoint with this plan (naming the field), or None."""
    found = latest_checkpoint(run_dir)
    if found is None:
        return None
    _, ck, _ = found
    world, layout = saved_world_size(ck)
    if world is None or world == spec.world_size:
        return None
    was = (f"{world} ranks (sp_size {layout['sp_size']} x dp_size {layout['dp_size']})" if layout
           else f"{world} ranks")
    field = "parallel.sp_size" if layout and layout.get("sp_size") != spec.sp_size else "parallel.dp_size"
    return (f"{field}: --resume: {ck} was saved by {was}, this plan has {spec.world_size} "
            f"(sp_size {spec.sp_size} x dp_size {spec.dp_size}); ZeRO's per-rank shards load only into the same "
            f"number of ranks (DeepSpeed's universal-checkpoint conversion is not wired in): keep sp_size x dp_size "
            f"at {world}, or start without --resume")
