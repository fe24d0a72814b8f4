"""llama-cpp-python opens two /dev/null files at import and never closes them; `make demo` ended with two
`ResourceWarning: unclosed file '/dev/null'` lines (issue 39): the check whether it is installed imported it with
no filter. Run in Python's development mode, where every ResourceWarning is shown."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("llama_cpp")


@pytest.mark.parametrize(
    "code",
    [
        "from flowrl.engines.llama_cpp_backend import llama_cpp_available; assert llama_cpp_available()",
        "from flowrl.engines.choice import pick_engine; pick_engine('auto')",
        "from flowrl.serve import load; load.plan('default')",
    ],
)
def test_importing_llama_cpp_through_flowrl_leaves_no_resource_warning(code: str) -> None:
    done = subprocess.run([sys.executable, "-X", "dev", "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "ResourceWarning" not in done.stderr, done.stderr
