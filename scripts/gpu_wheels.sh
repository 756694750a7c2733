#!/usr/bin/env bash
# The packages `make gpu-check` needs on a bare CUDA machine that has no network and comes with its own Python
# interpreter holding torch (a venv itself, e.g. /opt/torch/.venv: torch, accelerate, Triton, an older
# transformers), and nothing of ours. docs/gpu-check.md gives the commands for such a machine.
#
#   bash scripts/gpu_wheels.sh prepare DIR         on any machine with PyPI (this CPU one): fill DIR with
#                                                  deepspeed's sdist, liger-kernel's wheel, transformers at our
#                                                  pin with its dependencies, the trainer's own (pydantic,
#                                                  PyYAML, psutil, nvidia-ml-py), DeepSpeed's, build tools, and
#                                                  this project's wheel; never torch, Triton or CUDA wheels.
#                                                  Lists each file's size; refuses a folder over CARRY_MIB.
#   bash scripts/gpu_wheels.sh install DIR         on the GPU machine: the check venv (below), installed from DIR
#                                                  with no index, then the versions asserted.
#   bash scripts/gpu_wheels.sh check DIR [ARGS]    install, then bench/gpu_check.py ARGS (the install's seconds
#                                                  count in the check's time budget: --t0).
#   bash scripts/gpu_wheels.sh window DIR [ARGS]   install, then bench/gpu_check_window.py ARGS (--t0 as for check;
#                                                  the install's output goes into the window's tar). A failed install
#                                                  is reported and the window still runs what it can and writes its
#                                                  tar.
#
# Where it installs. TORCH_PYTHON (default /opt/torch/.venv/bin/python3 where it exists, else python3) is the
# interpreter that holds torch. A `--system-site-packages` venv made from inside a venv sees the BASE
# interpreter's packages, not that venv's, so it cannot see torch. Instead GPU_VENV is a plain venv made by that
# interpreter, with one .pth file listing TORCH_PYTHON's site-packages folders: it imports the machine's torch,
# accelerate and Triton, pip counts them as installed (liger-kernel's `torch>=2.1.2` is met with no index), and
# what we install lands in GPU_VENV, whose own site-packages come first on sys.path, so transformers at our pin
# shadows the machine's older one. The machine's own venv is left untouched (the install can be repeated, and a
# failed install cannot break the interpreter the machine came with).
set -euo pipefail
cd "$(dirname "$0")/.."

# the pins of pyproject.toml (tests/unit/test_gpu_check.py holds them equal)
DEEPSPEED=0.19.8
TRANSFORMERS=5.23.0
LIGER=0.8.5
PYDANTIC=2.14.3
PYYAML=6.0.3
PSUTIL=7.2.2
NVML=13.615.71
# DeepSpeed's install requirements besides torch (its requirements/requirements.txt), and build tools for the sdist
DS_REQUIRES="hjson msgpack ninja numpy packaging psutil py-cpuinfo tqdm einops"
BUILD_TOOLS="setuptools wheel"  # and pip, for an interpreter without ensurepip
TARGET_PY=${TARGET_PY:-3.12}
GPU_VENV=${GPU_VENV:-.gpu-venv}
CARRY_MIB=${CARRY_MIB:-56}  # the device tool carries 64 MiB with the repo (~3 MiB tracked): room left for it
if [ -z "${TORCH_PYTHON:-}" ]; then
  if [ -x /opt/torch/.venv/bin/python3 ]; then TORCH_PYTHON=/opt/torch/.venv/bin/python3; else TORCH_PYTHON=python3; fi
fi

# pip with no configuration of this machine's (no index, no extra find-links, no constraints): what DIR holds only
offline_pip() {
  env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null \
    PIP_DISABLE_PIP_VERSION_CHECK=1 "$GPU_VENV/bin/python" -m pip install -q --no-index --find-links "$DIR" "$@"
}

prepare() {
  local py=${PYTHON:-python3}
  mkdir -p "$DIR"
  "$py" -m pip download -q --no-deps --no-binary :all: -d "$DIR" "deepspeed==$DEEPSPEED"
  "$py" -m pip download -q --no-deps -d "$DIR" "liger-kernel==$LIGER"
  # wheels for the target interpreter, with their dependencies (none of these pulls torch)
  "$py" -m pip download -q --only-binary :all: --python-version "$TARGET_PY" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$DIR" "transformers==$TRANSFORMERS" "pydantic==$PYDANTIC" "pyyaml==$PYYAML" "psutil==$PSUTIL" \
    "nvidia-ml-py==$NVML" $DS_REQUIRES $BUILD_TOOLS pip
  # numpy (15 MiB) stays the machine's: its torch and accelerate need it, so it is there
  rm -f "$DIR"/numpy-*.whl
  # this project's wheel (pure Python; installed without its service dependencies: the GPU check needs plan/ and
  # worker/trainer only)
  rm -f "$DIR"/ulysses_lab-*.whl
  "$py" -m pip wheel -q --no-deps -w "$DIR" . >/dev/null  # isolated build: setuptools from the index
  if ls "$DIR" | grep -qiE '^(torch|triton|nvidia_(cublas|cudnn|nccl|cuda))'; then
    echo "error: $DIR holds torch, Triton or CUDA wheels; the GPU machine's own must be used" >&2
    exit 1
  fi
  (cd "$DIR" && du -k -- * | sort -rn | awk '{printf "  %8.1f MiB  %s\n", $1/1024, $2}')
  local kib
  kib=$(du -sk "$DIR" | cut -f1)
  echo "prepared $DIR: $(ls "$DIR" | wc -l) files, $((kib / 1024)) MiB (limit $CARRY_MIB MiB)"
  if [ "$kib" -gt $((CARRY_MIB * 1024)) ]; then
    echo "error: $DIR is over $CARRY_MIB MiB: it would not travel with the repo" >&2
    exit 1
  fi
}

install() {
  [ -d "$DIR" ] || { echo "error: $DIR is not a directory (run: bash scripts/gpu_wheels.sh prepare $DIR)" >&2; exit 2; }
  "$TORCH_PYTHON" -c "import torch" 2>/dev/null || {
    echo "error: $TORCH_PYTHON cannot import torch: set TORCH_PYTHON to the interpreter that holds it" >&2; exit 3; }
  if [ ! -x "$GPU_VENV/bin/python" ]; then
    # an interpreter without ensurepip (Debian's without python3-venv, some uv-built ones): pip from DIR's wheel
    if ! "$TORCH_PYTHON" -m venv "$GPU_VENV" 2>/dev/null; then
      rm -rf "$GPU_VENV"
      "$TORCH_PYTHON" -m venv --without-pip "$GPU_VENV"
      local pipwhl
      pipwhl=$(ls "$DIR"/pip-*.whl | head -1)
      "$GPU_VENV/bin/python" "$pipwhl/pip" install -q --no-index --find-links "$DIR" pip
    fi
    # every site-packages folder of the torch interpreter, after GPU_VENV's own (a .pth appends to sys.path)
    local site
    site=$("$GPU_VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    "$TORCH_PYTHON" -c "import sys; print('\n'.join(p for p in sys.path if p.endswith(('site-packages', 'dist-packages'))))" \
      > "$site/torch-machine.pth"
  fi
  offline_pip $BUILD_TOOLS
  offline_pip "transformers==$TRANSFORMERS" "pydantic==$PYDANTIC" "pyyaml==$PYYAML" "psutil==$PSUTIL" \
    "nvidia-ml-py==$NVML" "liger-kernel==$LIGER" $DS_REQUIRES
  # DS_BUILD_OPS=0: ops build just in time (ninja), against the machine's torch (hence no build isolation)
  DS_BUILD_OPS=0 offline_pip --no-build-isolation "deepspeed==$DEEPSPEED"
  offline_pip --no-deps --ignore-requires-python "$DIR"/ulysses_lab-*.whl  # pyproject pins the service's 3.11
  # the versions, asserted before anything runs: ours at the pins, torch and accelerate the machine's
  "$GPU_VENV/bin/python" - "$TORCH_PYTHON" <<EOF
import importlib.metadata as md, sys, subprocess
want = {"deepspeed": "$DEEPSPEED", "transformers": "$TRANSFORMERS", "liger-kernel": "$LIGER",
        "pydantic": "$PYDANTIC", "pyyaml": "$PYYAML"}
bad = [f"{k} {md.version(k)} (want {v})" for k, v in want.items() if md.version(k) != v]
import torch, accelerate, transformers, deepspeed, plan, worker.trainer  # noqa: E401 - each must import
machine = subprocess.run([sys.argv[1], "-c", "import torch; print(torch.__file__)"], capture_output=True,
                         text=True).stdout.strip()
if torch.__file__ != machine:
    bad.append(f"torch from {torch.__file__}, not the machine's {machine}")
if not transformers.__file__.startswith(sys.prefix):
    bad.append(f"transformers from {transformers.__file__}, not from this venv ({sys.prefix})")
print(f"installed: torch {torch.__version__} (CUDA {torch.version.cuda}, the machine's), accelerate "
      f"{accelerate.__version__}, transformers {transformers.__version__}, deepspeed {deepspeed.__version__}, "
      f"liger-kernel {md.version('liger-kernel')}, ulysses-lab {md.version('ulysses-lab')}; python {sys.version.split()[0]}")
if bad:
    sys.exit("version check failed: " + "; ".join(bad))
EOF
}

cmd=${1:-}
DIR=${2:-}
case "$cmd" in
  prepare) [ -n "$DIR" ] || { echo "usage: $0 prepare DIR" >&2; exit 2; }; prepare ;;
  install) [ -n "$DIR" ] || { echo "usage: $0 install DIR" >&2; exit 2; }; install ;;
  check)
    [ -n "$DIR" ] || { echo "usage: $0 check DIR [gpu_check args]" >&2; exit 2; }
    t0=$(date +%s)
    install
    shift 2
    exec "$GPU_VENV/bin/python" bench/gpu_check.py --t0 "$t0" "$@" ;;
  window)
    [ -n "$DIR" ] || { echo "usage: $0 window DIR [gpu_check_window args]" >&2; exit 2; }
    t0=$(date +%s)
    log=$(mktemp)
    # install exits on an error: in a pipeline it runs in a subshell, so only the install stops
    if ! install 2>&1 | tee "$log"; then echo "install failed: the window runs what it can" | tee -a "$log"; fi
    shift 2
    py="$GPU_VENV/bin/python"
    [ -x "$py" ] || py=$TORCH_PYTHON
    exec "$py" bench/gpu_check_window.py --t0 "$t0" --install-log "$log" "$@" ;;
  *) echo "usage: $0 prepare DIR | install DIR | check DIR [gpu_check args] | window DIR [window args]" >&2; exit 2 ;;
esac
