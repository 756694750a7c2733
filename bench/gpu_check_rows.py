"""`make gpu-check`'s rows (bench/gpu_check.py): what each part trains, and the order rows run in."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bench.gpu_models import CPU_MODEL, LLAMA_1B, LLAMA_8B_4_LAYERS, SUITE_MODEL

if TYPE_CHECKING:
    from bench.gpu_check_run import Check

PARTS = ("suite", "overhead", "ulysses", "sweep", "probe")
ALST = {"zero_stage": 3, "offload_optimizer": True, "offload_params": True, "activation_checkpointing": True,
        "checkpoint_offload": True, "tiled_mlp": True, "tiled_logits_loss": True}
SWEEP_FEATURES = {
    "plain": {"zero_stage": 3, "activation_checkpointing": True},
    "tiled": {"zero_stage": 3, "activation_checkpointing": True, "tiled_mlp": True, "tiled_logits_loss": True},
    "alst": ALST,
}
PROBE_DEPTHS = (1, 2, 4)  # the probe part's reduced depths (the full depth is added where the planner says it fits)


@dataclass
class Row:
    part: str
    name: str
    model_name: str
    model: dict
    seq_len: int
    features: str
    training: dict
    steps: int = 3
    gpus: int = 1
    sp: int = 1
    gas: int = 1
    one_document: bool = False
    run: dict = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # added to the trainer's environment (e.g. a torch switch)
    estimate: dict | None = None

    @property
    def fits(self) -> bool | None:
        e = self.estimate
        return e["memory"]["fits"] if e and e["valid"] else None


def rows_for(ck: Check) -> list[Row]:
    """Every row of every part, in the order they run: rows predicted not to fit last."""
    cuda = ck.cuda
    model, seq, steps = (SUITE_MODEL, 8192, 4) if cuda else (CPU_MODEL, 256, 2)
    name = "suite-150m" if cuda else "tiny"
    out = [Row("suite", "suite-zero2", name, model, seq, "zero2", {}, steps),
           Row("suite", "suite-zero3", name, model, seq, "zero3", {"zero_stage": 3}, steps),
           Row("suite", "suite-alst", name, model, seq, "alst", ALST, steps)]
    if ck.flash:
        out.append(Row("suite", "suite-flash", name, model, seq, "zero3+flash",
                       {"attn_implementation": "flash_attention_2", "zero_stage": 3}, steps))
    if ck.liger:
        out += [Row("suite", "suite-liger", name, model, seq, "liger", {"liger_kernel": True}, steps),
                # Liger's fused loss under ZeRO-3: DeepSpeed gathers the lm_head weight it reads (plan/
                # training_fields.py liger_fused_loss); not yet run on a GPU
                Row("suite", "suite-liger-zero3", name, model, seq, "liger zero3", {"liger_kernel": True,
                                                                                    "zero_stage": 3}, steps),
                Row("suite", "suite-liger-alst", name, model, seq, "alst+liger", {**ALST, "liger_kernel": True}, steps)]
    out.append(Row("suite", "suite-resume", name, model, seq, "zero3 resume", {"zero_stage": 3}, 5 if cuda else 3,
                   run={"checkpoint_every": 3 if cuda else 2}))
    # the trainer's step against bench/bare_loop.py's on the same run directory (Check.overhead)
    out.append(Row("overhead", "overhead-zero2", name, model, seq, "trainer vs bare loop", {}, 6 if cuda else 4))
    exact = {"dtype": "fp32", "attn_implementation": "sdpa"}
    out.append(Row("ulysses", "ulysses-sp2", name, model, seq, "sp2 zero2", exact, steps, gpus=2, sp=2, gas=2))
    if cuda:
        out.append(Row("ulysses", "ulysses-sp2-zero3", name, model, seq, "sp2 zero3", {**exact, "zero_stage": 3},
                       3, gpus=2, sp=2, gas=2))
    if cuda:
        cases = [(m, cfg, f, s) for m, cfg in (("llama-1b", LLAMA_1B), ("llama-3.1-8b-4-layers", LLAMA_8B_4_LAYERS))
                 for f in SWEEP_FEATURES for s in (16384, 65536, 131072)]
    else:  # one row per feature set, and one predicted not to fit the rehearsal's small custom device
        cases = [("tiny", CPU_MODEL, f, s) for f, s in (("plain", 512), ("alst", 512), ("plain", 2048))]
    out += [Row("sweep", f"sweep-{m}-{f}-{s}", m, cfg, s, f, SWEEP_FEATURES[f], 2, one_document=True)
            for m, cfg, f, s in cases]
    out += probe_rows(cuda)
    from plan import estimate

    for r in out:
        r.estimate = estimate(ck.plan(r))
    # shortest first within a part, so a spent budget cuts the longest rows; rows predicted not to fit at the end
    return sorted(out, key=lambda r: (r.fits is False, PARTS.index(r.part), r.seq_len))


def probe_rows(cuda: bool) -> list[Row]:
    """The probe part: `ulab probe` at 1, 2 and 4 layers of a model, extrapolated to its depth, and on to the
    full-depth run where the planner predicts it fits on this device. GPU: a ~1B Llama (16 layers; its full depth
    fits one GPU), Llama-3.1-8B's shape at its 32 layers (does not fit one GPU unsharded: extrapolated only) and
    at 8 of them (fits: the extrapolation checked at the 8B layer shape). CPU (make gpu-rehearsal): the tiny model
    at 8 layers (full run) and at 16 layers and 2048 tokens, predicted not to fit the rehearsal's small device."""
    depths = ",".join(map(str, PROBE_DEPTHS))
    if cuda:
        cases = [("llama-1b", LLAMA_1B, 8192), ("llama-3.1-8b", {**LLAMA_8B_4_LAYERS, "num_hidden_layers": 32}, 8192),
                 ("llama-3.1-8b-8-layers", {**LLAMA_8B_4_LAYERS, "num_hidden_layers": 8}, 8192)]
        steps = 4
    else:
        cases = [("tiny-8-layers", {**CPU_MODEL, "num_hidden_layers": 8}, 256),
                 ("tiny-16-layers", {**CPU_MODEL, "num_hidden_layers": 16}, 2048)]
        steps = 3
    return [Row("probe", f"probe-{m}-{s}", m, cfg, s, f"probe {depths} -> {cfg['num_hidden_layers']}",
                {"zero_stage": 2}, steps) for m, cfg, s in cases]


def select(rows: list[Row], parts: set[str], only: str | None, skip: str | None) -> list[Row]:
    return [r for r in rows if r.part in parts and (not only or re.search(only, r.name))
            and not (skip and re.search(skip, r.name))]
