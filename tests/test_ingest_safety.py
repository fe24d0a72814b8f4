"""The restricted unpickler and bad input: hostile, truncated, empty, corrupt, unknown and vanishing files."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
from pathlib import Path

import pytest

from flowrl.errors import IngestError, UnsafePickleError
from flowrl.ingest import ALLOWED, CheckpointLoader, ingest_paths
from flowrl.ingest.engine import Ingestor
from flowrl.ingest.unpickler import load_restricted, loads_restricted
from flowrl.store.files import TraceStore
from tests.fakes import flowagent_files as samples

FIXTURE_CP = "tb_data_dir/.data/main-vm/Agents/checkpoint/sample_agent"


class RunsACommand:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class CallsEval:
    def __reduce__(self):
        return (eval, ("__import__('os').getcwd()",))


class OpensAProcess:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (subprocess.Popen, (["touch", str(self.marker)],))


def _checkpoint_dir(tmp_path: Path) -> Path:
    return tmp_path / "Agents" / "checkpoint" / "agent"


def test_fixture_checkpoints_load_with_the_allow_list(flowagent_fixtures: Path) -> None:
    for p in sorted((flowagent_fixtures / FIXTURE_CP).glob("*.pkl")):
        assert type(load_restricted(p)).__name__ == "V2Checkpoint"


def test_allow_list_is_exactly_what_checkpoints_hold() -> None:
    modules = {m for m, _ in ALLOWED}
    assert modules == {
        "toolboxv2.mods.isaa.base.Agent.checkpoint_manager",
        "toolboxv2.mods.isaa.base.Agent.types",
        "toolboxv2.mods.isaa.base.Agent.vfs_v2",
        "datetime",
        "collections",
        "_codecs",
        "builtins",
    }
    assert {n for m, n in ALLOWED if m == "builtins"} == {"set", "frozenset", "complex", "bytes", "bytearray"}
    for dangerous in ("eval", "exec", "getattr", "__import__", "open", "compile", "setattr", "globals"):
        assert ("builtins", dangerous) not in ALLOWED


def test_hostile_pickle_is_rejected_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = _checkpoint_dir(tmp_path) / "agent_checkpoint_20261122_164945.pkl"
    path.parent.mkdir(parents=True)
    path.write_bytes(pickle.dumps(RunsACommand(marker)))
    with pytest.raises(UnsafePickleError) as err:
        load_restricted(path)
    assert str(path) in str(err.value) and "posix.system" in str(err.value)
    loader = CheckpointLoader(tmp_path)
    assert loader.load() == []
    assert (
        loader.summary.rejected_count == 1 and "refused to load class posix.system" in loader.summary.rejected[0].reason
    )
    assert not marker.exists()


@pytest.mark.parametrize("make", [lambda m: CallsEval(), OpensAProcess])
def test_other_hostile_globals_are_refused(make, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    with pytest.raises(UnsafePickleError, match="refused to load class"):
        loads_restricted(pickle.dumps(make(marker)), origin="evil.pkl")
    assert not marker.exists()


def test_hostile_object_hidden_inside_a_real_looking_checkpoint(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    cp = samples.v2_checkpoint("agent", {"s": samples.turn("q", "a", "aaaa0001")})
    cp.sessions_data["sessions"]["s"]["metadata"] = {"payload": RunsACommand(marker)}
    path = samples.write_checkpoint(_checkpoint_dir(tmp_path), cp)
    with pytest.raises(UnsafePickleError, match="posix.system"):
        load_restricted(path)
    assert not marker.exists()


def test_sized_bytes_constructor_is_refused() -> None:
    payload = (
        b"\x80\x04\x95\x1b\x00\x00\x00\x00\x00\x00\x00\x8c\x08builtins\x94\x8c\x05bytes"
        b"\x94\x93\x94J\x00\xca\x9a;\x85\x94R\x94."
    )
    with pytest.raises(IngestError, match="not allowed"):
        loads_restricted(payload, origin="big.pkl")


def _good_and_bad(tmp_path: Path, flowagent_fixtures: Path) -> Path:
    cp_dir = _checkpoint_dir(tmp_path)
    cp_dir.mkdir(parents=True)
    good = sorted((flowagent_fixtures / FIXTURE_CP).glob("*.pkl"))[-1]
    shutil.copy(good, cp_dir / "agent_checkpoint_20261122_164947.pkl")
    data = good.read_bytes()
    (cp_dir / "agent_checkpoint_20261122_170000.pkl").write_bytes(data[: len(data) // 2])  # truncated
    (cp_dir / "agent_checkpoint_20261122_170001.pkl").write_bytes(b"")  # empty
    (cp_dir / "agent_checkpoint_20261122_170002.pkl").write_bytes(os.urandom(256))  # garbage
    (cp_dir / "agent_checkpoint_20261122_170003.pkl").write_bytes(
        samples.dumps(samples.v2_checkpoint("agent", {"s": samples.turn("q", "a", "bbbb0001")}, version="3.0"))
    )
    (cp_dir / "agent_checkpoint_20261122_170004.pkl").write_bytes(pickle.dumps({"not": "a checkpoint"}))
    obs = tmp_path / "Agents" / "agent" / "obs"
    obs.mkdir(parents=True)
    (obs / "run_deadbeef.json").write_text('{"run_id": "deadbeef", "steps": [')  # half-written JSON
    return tmp_path


def test_bad_files_are_reported_by_name_and_the_rest_is_ingested(tmp_path: Path, flowagent_fixtures: Path) -> None:
    root = _good_and_bad(tmp_path / "in", flowagent_fixtures)
    store = TraceStore(tmp_path / "store")
    summary = ingest_paths([root], store)
    assert summary.new == 3 and summary.ok
    reasons = {Path(r.path).name: r.reason for r in summary.rejected}
    assert set(reasons) == {
        "agent_checkpoint_20261122_170000.pkl",
        "agent_checkpoint_20261122_170001.pkl",
        "agent_checkpoint_20261122_170002.pkl",
        "agent_checkpoint_20261122_170003.pkl",
        "agent_checkpoint_20261122_170004.pkl",
        "run_deadbeef.json",
    }
    assert "truncated" in reasons["agent_checkpoint_20261122_170000.pkl"]
    assert "empty file" in reasons["agent_checkpoint_20261122_170001.pkl"]
    assert "unsupported checkpoint version '3.0'" in reasons["agent_checkpoint_20261122_170003.pkl"]
    assert "not a FlowAgent checkpoint" in reasons["agent_checkpoint_20261122_170004.pkl"]
    assert "not valid JSON" in reasons["run_deadbeef.json"]
    assert all(r.path in r.reason for r in summary.rejected)  # every reason names its file


def test_a_file_that_vanishes_while_being_read(tmp_path: Path, flowagent_fixtures: Path) -> None:
    cp_dir = _checkpoint_dir(tmp_path)
    cp_dir.mkdir(parents=True)
    for p in sorted((flowagent_fixtures / FIXTURE_CP).glob("*.pkl")):
        shutil.copy(p, cp_dir / p.name)
    doomed = cp_dir / "agent_checkpoint_20261122_164946.pkl"

    def on_file(src) -> None:
        if src.path == doomed:
            doomed.unlink()

    engine = Ingestor(on_file=on_file)
    traces = list(engine.run([tmp_path]))
    assert len(traces) == 3
    assert [r.reason for r in engine.summary.rejected] == [f"{doomed}: vanished before it could be read"]


def test_secrets_are_masked_before_anything_is_stored(tmp_path: Path) -> None:
    key = "sk-proj-" + "Q7fZ2kLm9XwP4tRv8YbN3cHs6JdE1gUa"
    cp = samples.v2_checkpoint("agent", {"s": samples.turn(f"my key is {key}", f"stored {key}", "cccc0001")})
    samples.write_checkpoint(_checkpoint_dir(tmp_path / "in"), cp)
    store = TraceStore(tmp_path / "store")
    summary = ingest_paths([tmp_path / "in"], store)
    assert summary.new == 1 and summary.masked >= 2
    for p in store.iter_paths():
        assert key not in p.read_text()
