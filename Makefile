# The README's two commands: `make demo` (set up and run the whole loop) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.flowrl-installed

.PHONY: setup system-deps test test-fast lint demo bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[train,dev]'
	touch $(STAMP)

# bubblewrap isolates the code sandbox; installed from Debian's packages when we are root.
system-deps:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null) \
	      || echo "warning: could not install bubblewrap; the sandbox falls back to unshare or limits alone"; \
	  else echo "warning: bubblewrap (bwrap) is missing: install it (apt-get install bubblewrap) for full sandbox isolation"; fi; }

test: setup system-deps
	$(BIN)/python -m pytest -q

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow and not integration"

lint: setup
	$(BIN)/ruff check flowrl tests bench

demo: setup system-deps
	$(BIN)/flowrl demo

bench: setup system-deps
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache build dist *.egg-info
