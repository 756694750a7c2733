# Two commands for a fresh machine: `make run` (install, build, migrate, start API + worker) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
FRONTEND_SRC := $(shell find frontend -path frontend/node_modules -prune -o -path frontend/dist -prune -o -type f -print 2>/dev/null)
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: run test install frontend chromium clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first: 2.13.0 is a CPU wheel on this machine's disk; the project's range then installs nothing more.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	rm -f $(VENV)/.installed-* && touch $@

frontend: frontend/dist/index.html

frontend/dist/index.html: $(FRONTEND_SRC)
	cd frontend && npm ci --no-audit --no-fund --loglevel=error && npm run build

chromium:
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)

# Embedded defaults: SQLite database and SQLAlchemy broker transport under var/; CPU ranks for training.
run: install frontend
	$(BIN)/ulab migrate
	@token=$$($(BIN)/ulab token create --role admin --name local-admin --file var/admin-token --reuse) && \
	echo "Ulysses Lab is starting: http://$(HOST):$(PORT)/#/signin?token=$$token" && \
	echo "  (admin token kept in var/admin-token; API docs at http://$(HOST):$(PORT)/docs; Ctrl-C stops it)"
	@ULAB_API_URL=http://$(HOST):$(PORT) $(BIN)/ulab worker --loglevel warning & worker=$$!; \
	trap 'kill $$worker 2>/dev/null; wait $$worker 2>/dev/null' EXIT INT TERM; \
	ULAB_API_URL=http://$(HOST):$(PORT) $(BIN)/ulab serve --no-migrate --host $(HOST) --port $(PORT)

# The whole suite against the real services (PostgreSQL and Redis on 127.0.0.1, Chromium, torchrun).
test: install frontend chromium
	$(BIN)/python -m pytest -q -ra --durations=15; code=$$?; \
	if [ $$code -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$code

clean:
	rm -rf $(VENV) frontend/node_modules frontend/dist var test-artifacts
