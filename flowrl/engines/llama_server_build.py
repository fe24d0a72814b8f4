"""Build `llama-server` from the llama.cpp sources vendored in the llama-cpp-python sdist, nothing else fetched.

    python -m flowrl.engines.llama_server_build [--dest DIR] [--jobs N]

It downloads the sdist of the llama-cpp-python version installed here (else the one flowrl pins) with pip,
builds only the `llama-server` target with cmake, statically linked (one file, no shared libraries beside it),
for this CPU (`GGML_NATIVE`) but without AMX (`NO_AMX`: a virtual machine may list AMX among its CPU's
features and still not run its instructions; ggml's AMX kernels for q8_0 then die with SIGILL, seen here),
and copies it to `DIR` (default: the `bin/` of this Python, where `flowrl.engines.llama_server.find_binary`
looks first). About as long as llama-cpp-python's own build: 7-10
minutes on 2 cores. It needs a C++ compiler and cmake (`apt-get install build-essential cmake`, or `pip install
cmake`).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PINNED = "0.3.36"  # constraints.txt's llama-cpp-python
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"  # x86-64 only; the Makefile builds llama-cpp-python so too


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama-cpp-python")
    except PackageNotFoundError:
        return PINNED


def _cmake() -> str:
    found = shutil.which("cmake") or str(Path(sys.prefix) / "bin" / "cmake")
    if not Path(found).is_file():
        raise SystemExit("llama-server build: no cmake: apt-get install cmake (or pip install cmake)")
    return found


def build(dest: Path, jobs: int, work: Path) -> Path:
    version = _version()
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
         f"llama-cpp-python=={version}", "-d", str(work)],
        check=True,
    )  # fmt: skip
    sdist = next(work.glob("llama_cpp_python-*.tar.gz"))
    prefix = f"{sdist.name.removesuffix('.tar.gz')}/vendor/llama.cpp/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        tar.extractall(work, members=members, filter="data")
    source, out = work / prefix, work / "build"
    cmake = _cmake()
    subprocess.run(
        [cmake, "-S", str(source), "-B", str(out), "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF",
         "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_TESTS=OFF",
         "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DGGML_NATIVE=ON",
         *([f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"] if platform.machine() == "x86_64" else [])],
        check=True,
    )  # fmt: skip
    subprocess.run([cmake, "--build", str(out), "--target", "llama-server", "-j", str(jobs)], check=True)
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / "llama-server"
    staging = dest / ".llama-server.partial"
    shutil.copy2(out / "bin" / "llama-server", staging)
    os.replace(staging, target)
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=Path(sys.prefix) / "bin")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="flowrl-llama-server-") as work:
        target = build(args.dest, args.jobs, Path(work))
    print(f"llama-server built: {target}")


if __name__ == "__main__":
    main()
