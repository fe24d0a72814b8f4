"""The done-when test of a store that scales out: two capturing processes, one S3 store (moto on 127.0.0.1).

Two subprocesses, each with its own writer id, capture 200 concurrent runs each into one `s3://bucket/store`
through `hook_into_agent`; a third process scores every trace (patches as side records). Then: exactly 400
traces, all ids distinct, every run there, no object overwritten (the segments' rows add up to 400), and the
scores merged on read.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

pytestmark = pytest.mark.integration

RUNS = 200
REPO = Path(__file__).resolve().parent.parent

CAPTURE = textwrap.dedent(
    """
    import asyncio, sys
    from flowrl.capture import hook_into_agent
    from flowrl.store.opener import open_store

    url, writer, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])

    class FleetAgent:
        name = "fleet"

        async def run(self, query: str) -> str:
            await asyncio.sleep(0.001)
            return query[::-1]

    store = open_store(url, writer_id=writer, flush_rows=64, flush_seconds=0.5)
    agent = FleetAgent()
    hook = hook_into_agent(agent, store=store, run_methods=["run"], redact=False)

    async def main() -> None:
        await asyncio.gather(*(agent.run(f"{writer} run {i}") for i in range(runs)))

    asyncio.run(main())
    ok = hook.flush(120)
    hook.unhook()
    print("written", hook.stats.written, "ok", ok)
    """
)

SCORE = textwrap.dedent(
    """
    import sys
    from flowrl.store.opener import open_store

    with open_store(sys.argv[1], writer_id="scorer", flush_rows=500) as store:
        for trace in list(store.iter_traces()):
            trace.rewards = {"length": len(trace.user_query) / 100}
            trace.reward_score = len(trace.user_query) / 100
            store.update(trace)
    print("scored")
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def s3_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    import fsspec.config

    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        "FSSPEC_S3_ENDPOINT_URL": endpoint,
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": endpoint})  # fsspec read its env at import
    try:
        yield env
    finally:
        server.stop()


def _run(script: str, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    full = {**os.environ, **env, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", script, *args], env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def test_two_processes_capture_into_one_s3_store(s3_env: dict[str, str]) -> None:
    import pyarrow.parquet as pq
    import s3fs

    from flowrl.store.segments import SegmentStore, names

    fs = s3fs.S3FileSystem(endpoint_url=s3_env["AWS_ENDPOINT_URL"], skip_instance_cache=True)
    fs.mkdir("fleet")
    url = "s3://fleet/store"
    writers = [_run(CAPTURE, url, f"host{k}-worker", str(RUNS), env=s3_env) for k in (1, 2)]
    for proc in writers:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out
        assert f"written {RUNS} ok True" in out, out
    scorer = _run(SCORE, url, env=s3_env)
    out, _ = scorer.communicate(timeout=300)
    assert scorer.returncode == 0 and "scored" in out, out

    store = SegmentStore(url, writer_id="reader")
    traces = list(store.iter_traces())
    ids = [t.trace_id for t in traces]
    assert len(ids) == 2 * RUNS and len(set(ids)) == 2 * RUNS and store.count() == 2 * RUNS
    assert {t.user_query for t in traces} == {f"host{k}-worker run {i}" for k in (1, 2) for i in range(RUNS)}
    assert all(t.reward_score == len(t.user_query) / 100 and t.rewards for t in traces)  # side records merged
    assert not store.problems

    objects = fs.find("fleet/store")
    segments = [p for p in objects if p.endswith(".parquet")]
    writers_seen = {names.parse_object(p.rsplit("/", 1)[1], p.rsplit(".", 1)[1])[0] for p in objects}
    assert writers_seen == {"host1-worker", "host2-worker", "scorer"}
    assert len(set(objects)) == len(objects)
    rows = sum(pq.ParquetFile(fs.open(p, "rb")).metadata.num_rows for p in segments)
    assert rows == 2 * RUNS  # no object was overwritten: every row written is still there
    assert all(p.split("/")[2] in ("segments", "sidecar") and p.split("/")[3].startswith("date=") for p in objects)


def test_an_existing_object_is_refused_not_replaced(s3_env: dict[str, str]) -> None:
    import s3fs

    from flowrl.store.segments.fs import Root

    fs = s3fs.S3FileSystem(endpoint_url=s3_env["AWS_ENDPOINT_URL"], skip_instance_cache=True)
    fs.mkdir("excl")
    root = Root("s3://excl/store")
    drawn = iter(["w-000001-000000000000.parquet"] * 2 + ["w-000002-000000000000.parquet"])
    first = root.put_new("segments/date=2026-03-01", lambda: next(drawn), b"first")
    second = root.put_new("segments/date=2026-03-01", lambda: next(drawn), b"second")  # If-None-Match: drawn again
    assert first != second and fs.cat(first) == b"first" and fs.cat(second) == b"second"
