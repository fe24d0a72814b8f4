"""flowrl's imports keep to its layers, with no circle (import-linter's contracts in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "flowrl"


def test_the_import_contracts_hold() -> None:
    """The layers and the no-circle rule in pyproject.toml (`[tool.importlinter]`; `make lint` runs the same
    check): an import inside a function or under TYPE_CHECKING counts, so a circle cannot hide there."""
    lint_imports = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [str(lint_imports), "--no-cache", str(ROOT.parent / "pyproject.toml")],
        cwd=ROOT.parent,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert "0 broken" in done.stdout


def test_every_lazy_export_resolves() -> None:
    """A name in a package's lazy-export table is importable (a renamed function must not leave a dead entry)."""
    import importlib

    for init in ROOT.rglob("__init__.py"):
        module = ".".join(init.relative_to(ROOT.parent).with_suffix("").parts[:-1])
        package = importlib.import_module(module)
        for name, target in getattr(package, "_LAZY", {}).items():
            assert hasattr(importlib.import_module(target), name), f"{module}.{name} -> {target} does not exist"


def test_a_local_flowrl_import_says_why(tmp_path: Path) -> None:
    """`make lint` refuses a function-local import of flowrl without a comment (scripts/check_local_imports.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_local_imports", ROOT.parent / "scripts/check_local_imports.py")
    assert spec is not None and spec.loader is not None
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    bad = tmp_path / "bad.py"
    bad.write_text(
        "def f():\n    from flowrl.trace import facts\n\n"
        "def g():\n    import torch\n\n"
        "def h():\n    from flowrl.trace import schema  # lazy: a reason\n"
    )
    assert check.unexplained(bad) == [f"{bad}:2: from flowrl.trace import facts"]
    assert check.main([str(ROOT)]) == 0
