"""The toolboxv2 venv for the FlowAgent integration tests (test_real_flowagent.py, test_improve_flowagent.py):
`toolbox_env` is tests/integration/toolbox_env.py (loaded by path: it is also a script run by the system Python),
`toolbox_python` the venv's interpreter, built on first use and skipped with the reason when pip cannot reach an
index (set FLOWRL_REQUIRE_TOOLBOX=1 to make that a failure)."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).resolve().parent


def _load_toolbox_env() -> ModuleType:
    spec = importlib.util.spec_from_file_location("flowrl_it_toolbox_env", HERE / "toolbox_env.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_TOOLBOX_ENV = _load_toolbox_env()


@pytest.fixture(scope="session")
def toolbox_env() -> ModuleType:
    return _TOOLBOX_ENV


@pytest.fixture(scope="session")
def toolbox_python(toolbox_env: ModuleType) -> Path:
    venv = Path(os.environ.get("FLOWRL_TOOLBOX_VENV", toolbox_env.DEFAULT_VENV))
    t0 = time.monotonic()
    try:
        py = Path(toolbox_env.ensure(venv, log=lambda *_: None))
    except toolbox_env.EnvError as exc:
        if exc.code == toolbox_env.EXIT_INSTALL_FAILED and os.environ.get("FLOWRL_REQUIRE_TOOLBOX") != "1":
            pytest.skip(
                f"toolboxv2 {toolbox_env.TOOLBOXV2_VERSION} cannot be installed here ({exc}); "
                "run scripts/setup_toolboxv2_env.sh where PyPI is reachable"
            )
        raise
    print(f"toolboxv2 venv ready in {time.monotonic() - t0:.1f} s: {py}")
    return py
