"""Build (once) and check the separate venv that holds the real toolboxv2 FlowAgent.

toolboxv2 is never installed into flowrl's own venv: its dependency set (aiohttp, minio, pyzmq, ...)
could move packages under the pinned training stack. This venv holds toolboxv2 0.1.28, the few
packages that make its isaa feature unpack and import (toolboxv2's `[isaa]` extra cannot be
installed: it pins `fitz`, which does not resolve), and flowrl itself without extras.

Stdlib only, so it runs under any Python 3.11+:

    python3 tests/integration/toolbox_env.py [--venv DIR] [--force]   # or scripts/setup_toolboxv2_env.sh

Re-running is a no-op (well under a second) while the venv exists, its check passes and nothing that
goes into it changed (the pins below, flowrl's pyproject.toml, the repository path).

Exit codes: 0 ready; 3 the packages could not be installed (no network, no index); 1 anything else.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_VENV = REPO_ROOT / ".venv-toolbox"
TOOLBOXV2_VERSION = "0.1.28"
# numpy, networkx, dill: isaa "marker" packages that make toolboxv2's feature loader unpack the isaa
# zip on import; the rest are imported by the agent code at module level.
PACKAGES = [
    f"toolboxv2=={TOOLBOXV2_VERSION}",
    "numpy",
    "networkx",
    "dill",
    "nest-asyncio",
    "tenacity",
    "html2text",
    "chardet",
    # FlowAgent's router sends a model with no native adapter (`openai/<served policy>`) to LiteLLM
    "litellm==1.110.2",
]
STAMP_NAME = ".flowrl-toolbox-env.json"
EXIT_INSTALL_FAILED = 3

# What the check imports. It runs sandboxed (see sandbox_env) because importing toolboxv2 writes
# files under TB_DATA_DIR and ~/.config/ToolBoxV2.
_CHECK = r"""
import json, os, sys
import toolboxv2
from toolboxv2.mods.isaa.base.Agent.flow_agent import FlowAgent, MockRouter
from toolboxv2.mods.isaa.base.Agent.types import AgentModelData
import flowrl
print("FLOWRL_ENV_CHECK " + json.dumps({
    "python": sys.version.split()[0],
    "toolboxv2": os.path.dirname(toolboxv2.__file__),
    "flowrl": os.path.dirname(flowrl.__file__),
}))
sys.stdout.flush()
os._exit(0)  # skip toolboxv2's exit handlers (MinIO retries); nothing here needs them
"""

FAKE_TOOL = """#!/bin/sh
# Installed first on PATH by flowrl's FlowAgent integration test. toolboxv2's isaa web helper runs
# `os.system("pip install playwright && playwright install chromium")` at import when playwright is
# missing; this stand-in records the attempt and refuses, so nothing is installed anywhere.
echo "$0 $*" >> "${FLOWRL_FAKE_TOOL_LOG:-/dev/null}"
echo "flowrl integration sandbox: '$(basename "$0")' is disabled here" >&2
exit 1
"""
FAKE_TOOLS = ("pip", "pip3", "pip3.11", "pip3.12", "playwright")


class EnvError(Exception):
    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def make_fake_bin(directory: Path) -> Path:
    """A folder of `pip`/`playwright` stand-ins that exit 1; put it first on PATH."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in FAKE_TOOLS:
        path = directory / name
        path.write_text(FAKE_TOOL)
        path.chmod(0o755)
    return directory


def sandbox_env(root: Path, venv: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """A minimal environment whose HOME, TB_DATA_DIR, TMPDIR and FLOWRL_HOME lie under `root` and
    whose PATH starts with the fake pip/playwright folder. Nothing of the caller's env leaks in."""
    home, data, tmp = root / "home", root / "tb_data", root / "tmp"
    for d in (home, data, tmp):
        d.mkdir(parents=True, exist_ok=True)
    fake = make_fake_bin(root / "fakebin")
    env = {
        "PATH": os.pathsep.join([str(fake), str(venv / "bin"), "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": str(home),
        "TB_DATA_DIR": str(data),
        "TMPDIR": str(tmp),
        "FLOWRL_HOME": str(root / "flowrl_home"),
        "FLOWRL_FAKE_TOOL_LOG": str(root / "fake_tool_calls.log"),
        "PYTHONPATH": str(REPO_ROOT),
        "PYTHONUNBUFFERED": "1",
        "PYTHONIOENCODING": "utf-8",
        "LANG": "C.UTF-8",
        "NO_COLOR": "1",
    }
    env.update(extra or {})
    return env


def _fingerprint() -> dict[str, str]:
    pyproject = REPO_ROOT / "pyproject.toml"
    digest = hashlib.sha256(pyproject.read_bytes()).hexdigest()[:16] if pyproject.exists() else "-"
    return {"packages": " ".join(PACKAGES), "repo": str(REPO_ROOT), "pyproject": digest}


def _run(cmd: list[str], *, env: dict[str, str] | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def check(venv: Path) -> dict:
    """Import FlowAgent and flowrl in the venv (sandboxed). Returns what the check printed."""
    py = venv_python(venv)
    if not py.exists():
        raise EnvError(f"{py} does not exist")
    with tempfile.TemporaryDirectory(prefix="flowrl-tbcheck-") as tmp:
        proc = _run([str(py), "-c", _CHECK], env=sandbox_env(Path(tmp), venv), timeout=180)
    for line in proc.stdout.splitlines():
        if line.startswith("FLOWRL_ENV_CHECK "):
            return json.loads(line.split(" ", 1)[1])
    tail = (proc.stdout + proc.stderr)[-2000:]
    raise EnvError(f"importing FlowAgent in {venv} failed (exit {proc.returncode}):\n{tail}")


_QUICK = (
    "import importlib.util as u, pathlib, sys\n"
    "tb = u.find_spec('toolboxv2')\n"
    "ok = tb is not None and u.find_spec('flowrl') is not None and (pathlib.Path(tb.origin).parent"
    " / 'mods/isaa/base/Agent/flow_agent.py').is_file()\n"
    "sys.exit(0 if ok else 1)\n"
)


def _quick_ok(venv: Path) -> bool:
    """Cheap re-check of a stamped venv (no toolboxv2 import, so no side effects)."""
    py = venv_python(venv)
    if not py.exists():
        return False
    try:
        return _run([str(py), "-c", _QUICK], timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _read_stamp(venv: Path) -> dict | None:
    try:
        return json.loads((venv / STAMP_NAME).read_text())
    except (OSError, ValueError):
        return None


@contextmanager
def _lock(venv: Path):
    """One builder at a time (parallel pytest workers, a person running the script meanwhile)."""
    import fcntl

    key = hashlib.sha256(str(venv).encode()).hexdigest()[:12]
    with open(Path(tempfile.gettempdir()) / f"flowrl-toolbox-env-{key}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure(venv: Path = DEFAULT_VENV, *, force: bool = False, log=print) -> Path:
    """Create or reuse the toolboxv2 venv; returns its python. Raises EnvError (code 3 when pip
    could not install the packages, e.g. without network)."""
    venv = Path(venv).absolute()
    with _lock(venv):
        stamp = _read_stamp(venv)
        if not force and stamp is not None and stamp.get("fingerprint") == _fingerprint():
            if stamp.get("check") and _quick_ok(venv):
                return venv_python(venv)
        t0 = time.monotonic()
        if force and venv.exists():
            shutil.rmtree(venv)
        if not venv_python(venv).exists():
            log(f"creating {venv}")
            proc = _run([sys.executable, "-m", "venv", str(venv)], timeout=300)
            if proc.returncode != 0:
                raise EnvError(f"python -m venv {venv} failed:\n{proc.stderr[-2000:]}")
            # Keep git away from it whatever the repository's .gitignore says (as Python 3.13's venv does).
            (venv / ".gitignore").write_text("# created by flowrl's tests/integration/toolbox_env.py\n*\n")
        py = str(venv_python(venv))
        pip = [py, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        log(f"installing {' '.join(PACKAGES)}")
        proc = _run(pip + PACKAGES)
        if proc.returncode != 0:
            raise EnvError(
                f"pip could not install toolboxv2=={TOOLBOXV2_VERSION} into {venv}:\n{_pip_error(proc)}",
                EXIT_INSTALL_FAILED,
            )
        log(f"installing flowrl (no extras) from {REPO_ROOT}")
        proc = _run(pip + ["-e", str(REPO_ROOT)])
        if proc.returncode != 0:
            raise EnvError(
                f"pip could not install flowrl's core dependencies into {venv}:\n{_pip_error(proc)}",
                EXIT_INSTALL_FAILED,
            )
        info = check(venv)  # also unpacks toolboxv2's isaa feature into the venv, once
        stamp = {"fingerprint": _fingerprint(), "check": info, "built_in_s": round(time.monotonic() - t0, 1)}
        (venv / STAMP_NAME).write_text(json.dumps(stamp, indent=1))
        log(f"ready in {stamp['built_in_s']} s: {info}")
        return venv_python(venv)


def _pip_error(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if not ln.startswith("WARNING: Location")]
    return "\n".join(lines[-15:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Build the separate toolboxv2 venv for flowrl's FlowAgent integration test."
    )
    parser.add_argument("--venv", default=os.environ.get("FLOWRL_TOOLBOX_VENV", str(DEFAULT_VENV)))
    parser.add_argument("--force", action="store_true", help="delete and rebuild the venv")
    parser.add_argument("--check", action="store_true", help="only run the import check on an existing venv")
    args = parser.parse_args(argv)
    try:
        if args.check:
            print(json.dumps(check(Path(args.venv))))
            return 0
        t0 = time.monotonic()
        py = ensure(Path(args.venv), force=args.force)
        print(f"{py} ({time.monotonic() - t0:.1f} s)")
        return 0
    except EnvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code


if __name__ == "__main__":
    sys.exit(main())
