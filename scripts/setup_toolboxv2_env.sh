#!/usr/bin/env bash
# Build (once) the separate venv with the real toolboxv2 FlowAgent 0.1.28 for flowrl's integration
# test (tests/integration/test_real_flowagent.py). Never touches flowrl's own .venv.
#   scripts/setup_toolboxv2_env.sh [--venv DIR] [--force] [--check]
# Default venv: .venv-toolbox/ in the repository root (or $FLOWRL_TOOLBOX_VENV). A second run is a
# no-op while the venv works. Exit 3: pip could not install the packages (e.g. no network).
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" tests/integration/toolbox_env.py "$@"
