#!/usr/bin/env bash
# The packages `make gpu-check` needs on a bare CUDA machine that has no network and comes with Python 3.12, torch,
# accelerate, Triton and an older transformers, and nothing of ours.
#
#   bash scripts/gpu_wheels.sh prepare DIR   on any machine with PyPI access (this CPU one): fill DIR with
#                                            deepspeed's source distribution, liger-kernel's pure-Python wheel,
#                                            transformers at our pin, and the Python 3.12 wheels they and the
#                                            trainer's own code (plan/: pydantic, PyYAML) need; never torch.
#   bash scripts/gpu_wheels.sh check DIR     on the GPU machine (what `make gpu-check GPU_WHEELS=DIR` runs):
#                                            a venv over the system's packages (torch, accelerate, Triton stay
#                                            the machine's), install from DIR only (deepspeed built there with
#                                            --no-build-isolation against that torch), then run the check from
#                                            the tree with PYTHONPATH (requires-python does not matter then).
set -euo pipefail
cd "$(dirname "$0")/.."

# the pins of pyproject.toml (tests/unit/test_gpu_check.py holds them equal)
DEEPSPEED=0.19.8
TRANSFORMERS=5.23.0
LIGER=0.8.5
PYDANTIC=2.14.3
PYYAML=6.0.3
# DeepSpeed's install requirements besides torch (its requirements/requirements.txt), and build tools for the sdist
DS_REQUIRES="hjson msgpack ninja numpy packaging psutil py-cpuinfo tqdm einops nvidia-ml-py"
BUILD_TOOLS="setuptools wheel"
TARGET_PY=${TARGET_PY:-3.12}
GPU_VENV=${GPU_VENV:-.gpu-venv}

prepare() {
  local dir=$1 py=${PYTHON:-python3}
  mkdir -p "$dir"
  "$py" -m pip download -q --no-deps --no-binary :all: -d "$dir" "deepspeed==$DEEPSPEED"
  "$py" -m pip download -q --no-deps -d "$dir" "liger-kernel==$LIGER"
  # wheels for the target interpreter, with their dependencies (none of these pulls torch)
  "$py" -m pip download -q --only-binary :all: --python-version "$TARGET_PY" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$dir" "transformers==$TRANSFORMERS" "pydantic==$PYDANTIC" "pyyaml==$PYYAML" $DS_REQUIRES $BUILD_TOOLS
  if ls "$dir" | grep -qiE '^(torch|nvidia_(cublas|cudnn|nccl))'; then
    echo "error: $dir holds torch or CUDA wheels; the GPU machine's own must be used" >&2
    exit 1
  fi
  echo "prepared $dir: $(ls "$dir" | wc -l) files, $(du -sh "$dir" | cut -f1)"
}

check() {
  local dir=$1 py=${PYTHON:-python3}
  [ -d "$dir" ] || { echo "error: GPU_WHEELS=$dir is not a directory" >&2; exit 2; }
  [ -x "$GPU_VENV/bin/python" ] || "$py" -m venv --system-site-packages "$GPU_VENV"
  local pip=("$GPU_VENV/bin/python" -m pip install -q --no-index --find-links "$dir")
  "${pip[@]}" $BUILD_TOOLS
  "${pip[@]}" "transformers==$TRANSFORMERS" "pydantic==$PYDANTIC" "pyyaml==$PYYAML" "liger-kernel==$LIGER" $DS_REQUIRES
  # DS_BUILD_OPS=0: ops build just in time (ninja); the trainer builds CPU Adam once before its ranks start
  DS_BUILD_OPS=0 "${pip[@]}" --no-build-isolation "deepspeed==$DEEPSPEED"
  PYTHONPATH="$PWD" exec "$GPU_VENV/bin/python" bench/gpu_check.py
}

case "${1:-}" in
  prepare) prepare "${2:?usage: $0 prepare DIR}" ;;
  check) check "${2:?usage: $0 check DIR}" ;;
  *) echo "usage: $0 prepare DIR | check DIR" >&2; exit 2 ;;
esac
