# The two commands a newcomer needs:
#   make run    - both services on this machine, chat page on a printed URL (MODEL=tiny: no download)
#   make test   - linters and every test
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MODEL ?= phi3

.PHONY: run test lint venv peers clean

$(VENV)/.installed: requirements-dev.txt phi3-sidecar/requirements.txt main-app/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip==25.3
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

venv: $(VENV)/.installed

# Opt-in: llama.cpp's server (built from source for this CPU) and the GGUF writer, for
# `python scripts/bench.py --peers`.
peers: venv
	$(PY) -m pip install --quiet -r requirements-peers.txt
	VENV=$(VENV) bash scripts/peers/build_llamacpp.sh

run: venv
	$(PY) scripts/run_local.py --model $(MODEL)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy phi3-sidecar/sidecar main-app/chatapp scripts

test: lint
	$(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache
