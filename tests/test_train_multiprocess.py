"""`flowrl train` on several processes: `accelerate launch --multi_gpu --num_processes 2` on the CPU, where it
starts two ranks that train with DDP over gloo (`--cpu` would start one process: multi-CPU needs MPI).

For SFT and KTO on a tiny random model, each test checks that the launch exits 0, that both processes were in
the run (the record names a 2-process gloo group, the profile `multi-cpu` with batch 2 per process, 4 per step),
that one adapter is saved and loads with PEFT, that the loss went down, that the console carries one report
(the first process's), and that no file was written twice: a `sitecustomize` put on the processes' path records
every file each rank opens for writing, renames or removes (Python's audit hooks), and the second rank must
have written nothing in the output folder or the dataset folder (it may only make sure a folder exists).

Slow: every launch starts three Python processes that import torch, transformers and TRL (about 30 s each on
a 2-core machine).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

pytest.importorskip("trl")
pytest.importorskip("accelerate")

from helpers_tiny_train import build_tiny_model, write_tiny_dataset  # noqa: E402

# Imported by every Python process that has this folder on PYTHONPATH; only the launched ranks (RANK set) record.
AUDIT_SITECUSTOMIZE = """
import json, os, sys

_rank = os.environ.get("RANK")
if _rank is not None and os.environ.get("FLOWRL_TEST_AUDIT_DIR"):
    _roots = tuple(r for r in os.environ.get("FLOWRL_TEST_AUDIT_ROOTS", "").split(os.pathsep) if r)
    _log = open(os.path.join(os.environ["FLOWRL_TEST_AUDIT_DIR"], "rank-" + _rank + ".jsonl"), "a", buffering=1)
    _writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def _path(value):
        if isinstance(value, int):
            return None
        try:
            return os.path.abspath(os.fsdecode(value))
        except TypeError:
            return None

    def _hook(event, args):
        paths = ()
        if event == "open":
            mode, flags = args[1], args[2]
            if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (mode is None and flags & _writing):
                paths = (args[0],)
        elif event in ("os.rename", "os.replace"):
            paths = args[:2]
        elif event in ("os.remove", "os.rmdir", "os.mkdir", "shutil.rmtree", "os.truncate"):
            paths = args[:1]
        for raw in paths:
            path = _path(raw)
            if path and path.startswith(_roots) and not path.startswith(os.environ["FLOWRL_TEST_AUDIT_DIR"]):
                _log.write(json.dumps([event, path]) + "\\n")

    sys.addaudithook(_hook)
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def _free_port() -> int:
    """A free TCP port for the rendezvous, so two launches on one machine do not meet on accelerate's 29500."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def _writes(audit: Path, rank: int) -> list[tuple[str, str]]:
    log = audit / f"rank-{rank}.jsonl"
    assert log.is_file(), f"rank {rank} never started (no audit log)"
    return [tuple(json.loads(line)) for line in log.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("method", ["sft", "kto"])
def test_two_processes_on_the_cpu_train_one_adapter(method: str, tiny: Path, tmp_path: Path) -> None:
    data = write_tiny_dataset(tmp_path / f"data-{method}", method, n=16)
    out, audit, site = tmp_path / "out", tmp_path / "audit", tmp_path / "site"
    audit.mkdir()
    site.mkdir()
    (site / "sitecustomize.py").write_text(AUDIT_SITECUSTOMIZE, encoding="utf-8")
    before = _snapshot(data)
    env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": "",  # the CPU path, even on a machine with GPUs
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "FLOWRL_TEST_AUDIT_DIR": str(audit),
        "FLOWRL_TEST_AUDIT_ROOTS": os.pathsep.join([str(out), str(data)]),
    }
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(_free_port()),
        "-m",
        "flowrl.cli",
        "train",
        "--method",
        method,
        "--dataset",
        str(data),
        "--base-model",
        str(tiny),
        "--output-dir",
        str(out),
        "--max-steps",
        "4",
        "--lr",
        "5e-3",
        "--max-length",
        "128",
        "--no-progress",
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    # one report on the console, from the first process; it names the processes
    printed = done.stdout + done.stderr
    assert printed.count(f"training {method} on") == 1 and "2 processes" in printed
    assert printed.count("done: step 4") == 1 and "profile multi-cpu" in printed
    assert "flowrl: error" not in printed and "Traceback" not in printed

    record = json.loads((out / "flowrl_train.json").read_text())
    result = record["result"]
    assert result["info"]["distributed"] == {"processes": 2, "backend": "gloo", "type": "MULTI_CPU"}
    settings = result["settings"]
    assert settings["profile"] == "multi-cpu" and settings["world_size"] == 2
    assert settings["per_device_train_batch_size"] == 2 and settings["effective_batch_size"] == 4
    assert result["hardware"]["world_size"] == 2 and result["global_step"] == 4
    assert "2 processes x accumulation 1 = 4 rows per step" in (out / "README.md").read_text()

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if not r.get("summary")]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]  # one line per step: one writer
    assert steps[-1]["loss"] < steps[0]["loss"]

    # one adapter, one checkpoint; it loads with PEFT onto the base
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4"]
    assert (out / "adapter_model.safetensors").is_file() and not list(out.glob("metrics.interrupted-*"))
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(tiny)), str(out))
    assert any("lora_" in name for name, _ in model.named_parameters())

    # nothing written twice: the second rank wrote nothing in the output or dataset folder, the dataset is as it was
    # (transformers makes sure the output and checkpoint folders exist in every rank, each saving its own
    # rng_state_N.pth there: creating a folder that may exist is no second write)
    first, second = _writes(audit, 0), _writes(audit, 1)
    assert [w for w in second if w[0] != "os.mkdir"] == [], second
    assert {path for _, path in second} <= {str(out), str(out / "checkpoint-4")}
    written = {path for _, path in first}
    assert {str(out / "metrics.jsonl"), str(out / "flowrl_train.json"), str(out / "README.md")} <= written
    assert not any(path.startswith(str(data)) for path in written)
    assert _snapshot(data) == before
