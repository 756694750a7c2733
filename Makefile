# Two commands for a fresh machine: `make run` (install, build, migrate, start API + worker) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
FRONTEND_SRC := $(shell find frontend -path frontend/node_modules -prune -o -path frontend/dist -prune -o -name openapi.json -prune -o -name schema.d.ts -prune -o -type f -print 2>/dev/null)
HOST ?= 127.0.0.1
PORT ?= 8000
# DeepSpeed's JIT-built CPU ops (`ds-ops`) live in this checkout, not in the shared ~/.cache/torch_extensions: the
# build flags name the venv's include paths, so two checkouts sharing one cache rebuild each other's ops whenever a
# rank of the other loads them (72 CPU-s for CPU Adam, measured), and a test's run waits on that build meanwhile.
# Everything make starts (the suite's ranks, `make run`'s worker and trainers) inherits it; tests/conftest.py sets
# the same for a pytest started by hand.
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/var/torch_extensions
# mypy's cache outside the checkout: it checks each module's hash, so one cache serves every checkout of this machine,
# and a fresh clone's lint reads it instead of checking torch's and Transformers' stubs again (33 -> 2 CPU-s).
export MYPY_CACHE_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/ulysses-lab/mypy
# The ops' C++ compiles go through ccache when it is installed (torch's cpp_extension puts `ccache` before the compiler
# whenever it finds one; `make ccache` installs it): with the paths under this checkout written relative to it
# (BASEDIR) and the build directory left out of the hash (NOHASHDIR; the ops compile with -g), a fresh clone on a
# machine that built the same sources before reuses the objects: `make ds-ops` 66 s -> ~10 s.
export CCACHE_BASEDIR ?= $(CURDIR)
export CCACHE_NOHASHDIR ?= 1

.PHONY: run test install frontend chromium slurm ccache system-packages ds-ops clean lint gpu-check gpu-rehearsal FORCE

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first: 2.13.0 is a CPU wheel on this machine's disk; the project's range then installs nothing more.
	$(BIN)/pip install -q --no-compile torch==2.13.0
	$(BIN)/pip install -q --no-compile -e '.[test,trackers]'
	# pip compiles what it installs one file after the other, on one core: compileall does it on every core (fresh
	# clone: 77 s of pip -> 21 s of pip and 20 s of compileall). Like pip, it carries on past the few files that do
	# not compile (test data of some packages written in old syntax), so its exit code is not checked.
	$(BIN)/python -m compileall -q -j 0 "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
	  >/dev/null 2>&1 || true
	rm -f $(VENV)/.installed-* && touch $@

frontend: frontend/dist/index.html

# The dashboard's TypeScript types are generated from the API's OpenAPI schema (which the plan model defines);
# `ulab openapi --out` rewrites the file only when the schema changed, so an unchanged API rebuilds nothing.
frontend/openapi.json: $(STAMP) FORCE
	$(BIN)/ulab openapi --out $@

# The dashboard's packages, installed (npm ci) once per package-lock.json: its build, lint and unit tests use them.
FRONTEND_DEPS := frontend/node_modules/.installed
$(FRONTEND_DEPS): frontend/package-lock.json
	cd frontend && npm ci --no-audit --no-fund --loglevel=error
	touch $@

# The planner bundles examples/tiny-llama-sp2.json (its "Tiny Llama" example is that file).
frontend/dist/index.html: $(FRONTEND_SRC) frontend/openapi.json examples/tiny-llama-sp2.json $(FRONTEND_DEPS)
	cd frontend && npm run build

# apt-get waits up to 5 minutes for dpkg's lock (another apt-get, unattended upgrades) rather than failing at once.
APT_INSTALL := apt-get -o DPkg::Lock::Timeout=300 install -y -qq
APT_UPDATE := apt-get -o DPkg::Lock::Timeout=300 update -qq

chromium:
	@command -v chromium >/dev/null || ($(APT_UPDATE) && $(APT_INSTALL) chromium >/dev/null)

# Debian's Slurm and munge for tests/integration/test_slurm.py, which starts its own one-node cluster (as root).
slurm:
	@(command -v sbatch && command -v slurmctld && command -v slurmd && command -v munged) >/dev/null 2>&1 || \
	($(APT_UPDATE) && $(APT_INSTALL) slurm-wlm munge >/dev/null)

# What `make test` needs from Debian (the three targets' packages), in one apt-get: `make test` runs this beside
# pip with -j3, and a sub-make of `chromium slurm ccache` inherited that parallelism, so on a fresh machine two
# apt-gets raced for dpkg's lock and the second failed ("Could not get lock /var/lib/dpkg/lock-frontend").
system-packages:
	@missing=""; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	(command -v sbatch && command -v slurmctld && command -v slurmd && command -v munged) >/dev/null 2>&1 || \
	  missing="$$missing slurm-wlm munge"; \
	command -v ccache >/dev/null || missing="$$missing ccache"; \
	if [ -n "$$missing" ]; then echo "apt-get install$$missing"; $(APT_UPDATE) && $(APT_INSTALL) $$missing >/dev/null; fi

# ccache for DeepSpeed's op builds (above).
ccache:
	@command -v ccache >/dev/null || ($(APT_UPDATE) && $(APT_INSTALL) ccache >/dev/null)

# DeepSpeed's C++ ops that CPU ranks JIT-build on first use (CPU Adam for offloaded optimizer states; the shared-memory
# collectives of its CPU backend): built once into $TORCH_EXTENSIONS_DIR (above), the cache the trainer's ranks load from.
# Loading them again costs ~45 CPU-s (importing DeepSpeed, its builders' compiler checks, ninja): skipped while both
# libraries are in the cache and this venv loaded them since its last install ($(VENV)/.ds-ops-loaded, newer than
# the install stamp; a new install or an emptied cache loads, and builds if need be, again).
DS_OPS_LOADED := $(VENV)/.ds-ops-loaded
ds-ops: install ccache
	@ext=$(TORCH_EXTENSIONS_DIR); \
	if [ $(DS_OPS_LOADED) -nt $(STAMP) ] && ls $$ext/cpu_adam/cpu_adam.so \
	  $$ext/deepspeed_shm_comm/deepspeed_shm_comm.so >/dev/null 2>&1; then \
	  echo "ds-ops: built and loaded before, in $$ext"; exit 0; fi; \
	$(BIN)/python -c "from deepspeed.accelerator import get_accelerator as acc; \
	builders = [acc().create_op_builder(n) for n in ('CPUAdamBuilder', 'ShareMemCommBuilder')]; \
	[b.load(verbose=False) for b in builders if b is not None and b.is_compatible()]" && touch $(DS_OPS_LOADED)

# Embedded defaults: SQLite database and SQLAlchemy broker transport under var/; CPU ranks for training. The worker
# speaks to the local API over HTTP, as any worker does, with the worker token kept in var/worker-token.
run: install frontend
	$(BIN)/ulab migrate
	@token=$$($(BIN)/ulab token create --role admin --name local-admin --file var/admin-token --reuse) && \
	echo "Ulysses Lab is starting: http://$(HOST):$(PORT)/#/signin?token=$$token" && \
	echo "  (admin token kept in var/admin-token; API docs at http://$(HOST):$(PORT)/docs; Ctrl-C stops it)"
	@$(BIN)/ulab token create --role worker --name local-worker --all-queues --file var/worker-token --reuse >/dev/null
	@env -u ULAB_DATABASE_URL ULAB_API_URL=http://$(HOST):$(PORT) $(BIN)/ulab worker --loglevel warning & worker=$$!; \
	trap 'kill $$worker 2>/dev/null; wait $$worker 2>/dev/null' EXIT INT TERM; \
	ULAB_API_URL=http://$(HOST):$(PORT) $(BIN)/ulab serve --no-migrate --host $(HOST) --port $(PORT)

# Lint (ruff: pyflakes, pycodestyle, import order, bugbear, pyupgrade) and types (mypy on plan/ and backend/); the
# dashboard's ESLint (typescript-eslint, React's rules of hooks; no warning allowed) and its vitest unit tests.
lint: install $(FRONTEND_DEPS)
	$(BIN)/ruff check .
	$(BIN)/mypy
	cd frontend && npm run --silent lint && npm test --silent

# The whole suite against the real services (PostgreSQL and Redis on 127.0.0.1, Chromium, torchrun, Slurm).
# First, side by side: the venv (pip, one core busy at most), the dashboard's npm packages and the Debian packages
# (one apt-get at a time: dpkg takes one). Then, side by side: the dashboard build (the e2e tests serve it) and DeepSpeed's ops build
# (the trainer's ranks load them). Lint (the `lint` target's ruff and mypy) needs nothing the tests make, so it runs
# beside pytest, its output kept in a file and printed, its exit code counted, once pytest ends: mypy no longer holds
# the suite back. Then two pytest processes, each taking whole files (--dist loadfile): much of
# the suite waits on services, browsers and the faults it injects, so two sessions keep both cores busy (each has
# its own database, Redis database and stack; trained layouts of the trainer tests are shared,
# tests/integration/trainer_runs.py). More processes did not help (three measured no faster): the cores are ~91% busy with two (vmstat), and each
# process adds its own stack and trained run. The longest files go first (tests/longest_first.py: xdist's own
# queue, most tests first, leaves them for the end, where one process runs them while the other idles). Each test's
# seconds land in var/junit.xml (`python bench/suite_durations.py var/junit.xml`: per file, and the two queues
# simulated). TEST_JOBS=0 runs in one process.
TEST_JOBS ?= 2
test:
	$(MAKE) --no-print-directory -j3 install $(FRONTEND_DEPS) system-packages
	$(MAKE) --no-print-directory -j2 frontend ds-ops
	@lint_log=$$(mktemp); ($(BIN)/ruff check . && $(BIN)/mypy && cd frontend && npm run --silent lint && npm test --silent) >$$lint_log 2>&1 & lint=$$!; \
	$(BIN)/python -m pytest -q -ra --durations=15 -n $(TEST_JOBS) --dist loadfile \
	  -p tests.longest_first --no-loadscope-reorder --junitxml=var/junit.xml; code=$$?; \
	wait $$lint; lint_code=$$?; echo "== lint (ran beside pytest):"; cat $$lint_log; rm -f $$lint_log; \
	if [ $$code -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; \
	if [ $$lint_code -ne 0 ]; then echo "lint failed (exit $$lint_code): see above"; exit $$lint_code; fi; \
	exit $$code

# The GPU check, outside `make test` (bench/gpu_check.py; docs/gpu-check.md): trainer runs on CUDA and the planner's
# prediction beside the allocator's figures, a CSV row appended as each run ends. Without a CUDA device it says so and
# exits 0 (GPU_CHECK_ARGS=--require-cuda makes that an error). On a bare GPU machine without network, pass the
# folder `bash scripts/gpu_wheels.sh prepare DIR` filled elsewhere: `make gpu-check GPU_WHEELS=DIR`.
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
GPU_CHECK_ARGS ?=
gpu-check:
	@if [ -n "$(GPU_WHEELS)" ]; then bash scripts/gpu_wheels.sh check "$(GPU_WHEELS)" $(GPU_CHECK_ARGS); \
	else PYTHONPATH=$(CURDIR) $(GPU_PYTHON) bench/gpu_check.py $(GPU_CHECK_ARGS); fi

# The GPU path rehearsed on this CPU machine (about 8 min on 2 idle cores with the machine venv, more on busy ones,
# so not in `make test`): a "machine" venv holding torch, Triton, accelerate and transformers 5.17 as the GPU
# machine's /opt/torch/.venv does; the wheel folder prepared for its Python; the check venv installed from that folder with no index (scripts/gpu_wheels.sh install, versions
# asserted); gpu_check without torch and with --require-cuda (both must fail); then every part in CPU mode, in three
# commands appending to one CSV (suite; ulysses and sweep; probe), and the CSV; last, the window's one call as
# docs/gpu-check.md gives it (scripts/gpu_wheels.sh window, --cpu), which must run every part within its budget and
# bring back one tar. DeepSpeed's ops build into a folder of its
# own: a build another checkout killed in the shared ~/.cache/torch_extensions leaves a lock every later build waits on.
REHEARSAL := var/rehearsal
# the window's budget on CPU: the parts' planned CPU seconds (bench/gpu_check_window.py) with room for a busy machine
WINDOW_CPU_BUDGET_S ?= 2400
gpu-rehearsal: install
	@set -e; mkdir -p $(REHEARSAL); \
	export TORCH_EXTENSIONS_DIR=$(CURDIR)/$(REHEARSAL)/torch_extensions; \
	if [ ! -x $(REHEARSAL)/machine/bin/python ] || ! $(REHEARSAL)/machine/bin/python -c "import torch, accelerate, triton" 2>/dev/null; then \
	  echo "== the machine's interpreter (torch, Triton 3.6, accelerate, transformers 5.17; no deepspeed)"; \
	  rm -rf $(REHEARSAL)/machine; $(PYTHON) -m venv $(REHEARSAL)/machine; \
	  $(REHEARSAL)/machine/bin/pip install -q torch==2.13.0 triton==3.6.0 accelerate==1.15.0 transformers==5.17.0 nvidia-ml-py==13.615.71; fi; \
	echo "== prepare the wheel folder (Python 3.11 here; 3.12 for the GPU machine)"; \
	TARGET_PY=3.11 PYTHON=$(BIN)/python bash scripts/gpu_wheels.sh prepare $(REHEARSAL)/wheels 2>&1 | grep -v '^WARNING: Location' | tail -3; \
	echo "== gpu_check without torch: must fail"; \
	if python3 -I bench/gpu_check.py --cpu >/dev/null 2>$(REHEARSAL)/no-torch.err; then echo "FAILED: exit 0 without torch"; exit 1; fi; \
	cat $(REHEARSAL)/no-torch.err; \
	rm -rf $(REHEARSAL)/check-venv $(REHEARSAL)/out; \
	echo "== install from the folder, no index, into a venv over the machine's torch"; \
	t0=$$(date +%s); \
	time TORCH_PYTHON=$(REHEARSAL)/machine/bin/python GPU_VENV=$(REHEARSAL)/check-venv bash scripts/gpu_wheels.sh install $(REHEARSAL)/wheels; \
	echo "== --require-cuda without CUDA: must fail"; \
	if $(REHEARSAL)/check-venv/bin/python bench/gpu_check.py --require-cuda; then echo "FAILED: exit 0"; exit 1; fi; \
	echo "== parts suite, overhead"; \
	$(REHEARSAL)/check-venv/bin/python bench/gpu_check.py --cpu --parts suite,overhead --out $(REHEARSAL)/out --t0 $$t0 --budget-s 3600 --min-row-s 20 --run-timeout-s 480; \
	echo "== rows so far:"; wc -l < $(REHEARSAL)/out/cpu-rehearsal-*.csv; \
	echo "== parts ulysses,sweep (the 2048-token rows are predicted not to fit: they run last)"; \
	$(REHEARSAL)/check-venv/bin/python bench/gpu_check.py --cpu --parts ulysses,sweep --out $(REHEARSAL)/out --t0 $$t0 --budget-s 3600 --min-row-s 20 --run-timeout-s 480; \
	echo "== part probe (tiny models at 1, 2, 4 layers, one launch each; the 8-layer one on to its full depth)"; \
	$(REHEARSAL)/check-venv/bin/python bench/gpu_check.py --cpu --parts probe --out $(REHEARSAL)/out --t0 $$t0 --budget-s 3600 --min-row-s 20 --run-timeout-s 480; \
	echo "== the CSV"; cut -d, -f1-10 $(REHEARSAL)/out/cpu-rehearsal-*.csv; \
	echo "== the window: docs/gpu-check.md's one call (install included), every part at CPU sizes, one tar back"; \
	rm -rf $(REHEARSAL)/window-out; \
	TORCH_PYTHON=$(REHEARSAL)/machine/bin/python GPU_VENV=$(REHEARSAL)/check-venv bash scripts/gpu_wheels.sh window \
	  $(REHEARSAL)/wheels --cpu --out $(REHEARSAL)/window-out --budget-s $(WINDOW_CPU_BUDGET_S); \
	ls $(REHEARSAL)/window-out; test "$$(ls $(REHEARSAL)/window-out)" = "$$(ls $(REHEARSAL)/window-out/*.tar.gz | xargs -n1 basename)"; \
	if tar -xOzf $(REHEARSAL)/window-out/*.tar.gz --wildcards '*/window.log' | grep 'skipped (time budget)'; then \
	  echo "FAILED: the rehearsal's budget left a part out"; exit 1; fi; \
	echo "gpu-rehearsal: passed in $$(( $$(date +%s) - t0 )) s after the machine venv"

clean:
	rm -rf $(VENV) frontend/node_modules frontend/dist var test-artifacts
