# The README's two commands: `make demo` (set up and run the whole loop) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.flowrl-installed
# llama.cpp for this CPU, without AMX: a virtual machine may list AMX and still not run it (ggml's q8_0 AMX
# kernels died with SIGILL here); flowrl/engines/llama_server_build.py builds llama-server the same way. Built with
# --no-cache-dir: pip's wheel cache is keyed by the sdist, not CMAKE_ARGS, and would hand back a wheel built otherwise
LLAMA_CMAKE_ARGS := $(if $(filter x86_64,$(shell uname -m)),-DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' -DCMAKE_CXX_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16',)

.PHONY: setup system-deps test test-fast lint demo bench clean

setup: $(STAMP)

# constraints.txt: the exact versions CI tests (pyproject.toml declares the supported ranges)
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[train,dev]'
	@echo "building llama-cpp-python (llama.cpp from source, about 7 minutes the first time)..."
	@CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/python -m pip install -q --no-cache-dir -c constraints.txt -e '.[llama]' >$(VENV)/llama-build.log 2>&1 \
	  || echo "warning: llama-cpp-python did not build (see $(VENV)/llama-build.log; it needs a C compiler: apt-get install build-essential). The example agent will generate with transformers, 4-6x slower, and the llama.cpp tests skip"
	@echo "building llama-server (llama.cpp's own server, from the same sources, about 7-10 minutes the first time)..."
	@$(BIN)/python -m flowrl.engines.llama_server_build >$(VENV)/llama-server-build.log 2>&1 \
	  || echo "warning: llama-server did not build (see $(VENV)/llama-server-build.log; it needs a C++ compiler and cmake: apt-get install build-essential cmake). flowrl improve, eval and the demo will generate with transformers, several times slower, and the llama-server tests skip"
	touch $(STAMP)

# From Debian's packages when we are root: bubblewrap isolates the code sandbox; chromium lets the
# report test look at the page in a real browser (that test skips without it); a C compiler builds
# llama-cpp-python and llama-server, with cmake (setup runs after this in `make test` and `make demo`); Go runs the Ollama templates
# through text/template in tests/test_export_ollama.py (that test skips without it).
system-deps:
	@missing=""; command -v bwrap >/dev/null 2>&1 || missing=" bubblewrap"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v cc >/dev/null 2>&1 || missing="$$missing build-essential"; \
	command -v go >/dev/null 2>&1 || missing="$$missing golang-go"; \
	command -v cmake >/dev/null 2>&1 || missing="$$missing cmake"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null) \
	      || echo "warning: could not install$$missing (without bubblewrap the sandbox falls back to unshare or limits alone; without chromium the browser test skips; without golang-go the Ollama template test skips)"; \
	  else echo "warning: missing$$missing: apt-get install$$missing (without bubblewrap the sandbox is weaker)"; fi; \
	fi

test: system-deps setup
	$(BIN)/python -m pytest -q

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow and not integration"

# ruff (lint and the format check), mypy and import-linter's layer contracts (all in pyproject.toml): what .ci/run
# runs before the tests
lint: setup
	$(BIN)/ruff check flowrl tests bench hooks scripts
	$(BIN)/ruff format --check flowrl tests bench hooks scripts
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache
	$(BIN)/python scripts/check_local_imports.py flowrl

demo: system-deps setup
	$(BIN)/flowrl demo

bench: system-deps setup
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache build dist *.egg-info
