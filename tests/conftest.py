"""Shared fixtures. Tests never touch the user's real store: FLOWRL_HOME points into tmp."""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
FLOWAGENT_FIXTURES = FIXTURES / "flowagent-0.1.28"


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path_factory.mktemp("flowrl_home")
    monkeypatch.setenv("FLOWRL_HOME", str(home))


@pytest.fixture
def flowagent_fixtures() -> Path:
    return FLOWAGENT_FIXTURES


@pytest.fixture
def served(tmp_path: Path):  # -> Iterator[tuple[str, OTLPReceiver, TraceStore]]
    """`flowrl serve-otlp` on a free port of 127.0.0.1, in a thread: (its URL, the receiver, the store)."""
    import threading

    from flowrl.ingest.otlp_receiver import OTLPReceiver, make_server
    from flowrl.store.files import TraceStore

    store = TraceStore(tmp_path / "traces")
    receiver = OTLPReceiver(store, pending_s=60.0)
    server = make_server(receiver, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    try:
        yield f"http://{host!s}:{port}", receiver, store
    finally:
        server.shutdown()
        server.server_close()
