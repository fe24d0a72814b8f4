"""Keep llama-cpp-python's own noise out of flowrl's output (used by the llama.cpp verifier and backend)."""

from __future__ import annotations

import atexit
import warnings

_EXIT_FILTER = False


def ignore_llama_devnull() -> None:
    """llama_cpp opens two /dev/null files at import and never closes them: a ResourceWarning at interpreter exit,
    not ours. The filter is added now and again at exit (a `warnings.catch_warnings()` block around the backend's
    creation, as `flowrl demo` has, would have dropped it by then)."""

    def ignore() -> None:
        warnings.filterwarnings("ignore", category=ResourceWarning, message=r"unclosed file .*name='/dev/null'")

    ignore()
    global _EXIT_FILTER
    if not _EXIT_FILTER:
        atexit.register(ignore)
        _EXIT_FILTER = True
