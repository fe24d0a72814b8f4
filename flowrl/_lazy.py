"""Lazy public names for a package: `import flowrl` (and its packages) stays light.

    __getattr__, __dir__ = lazy_exports(__name__, {"Name": "flowrl.module", ...}, eager=[...])

A name is imported from its module on first use and then cached in the package's namespace.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable
from typing import Any


def lazy_exports(
    package: str, exports: dict[str, str], eager: Iterable[str] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    names = sorted({*exports, *eager})

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return names

    return __getattr__, __dir__
