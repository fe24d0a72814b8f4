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

# From Debian's packages when we are root: bubblewrap isolates the code sandbox; chromium lets the
# report test look at the page in a real browser (that test skips without it).
system-deps:
	@missing=""; command -v bwrap >/dev/null 2>&1 || missing=" bubblewrap"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null) \
	      || echo "warning: could not install$$missing (without bubblewrap the sandbox falls back to unshare or limits alone; without chromium the browser test skips)"; \
	  else echo "warning: missing$$missing: apt-get install$$missing (without bubblewrap the sandbox is weaker)"; fi; \
	fi

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
