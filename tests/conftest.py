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
