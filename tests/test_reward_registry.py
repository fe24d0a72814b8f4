"""The reward table: a new reward is one file plus one registration line, and installed packages add rewards
through the `flowrl.rewards` entry-point group."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowrl.cli import main
from flowrl.errors import ConfigError
from flowrl.rewards import config
from flowrl.rewards.config import REGISTRY, load_config, register_reward, reward_names
from flowrl.rewards.engine import RewardEngine
from flowrl.store.files import TraceStore
from flowrl.trace.schema import ExecutionTrace


@pytest.fixture(autouse=True)
def _own_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test gets a copy of the table, restored afterwards; plugins are looked up again inside the test."""
    saved = dict(REGISTRY)
    monkeypatch.setattr(config, "_plugins_loaded", False)
    yield
    REGISTRY.clear()
    REGISTRY.update(saved)


def _fake_distribution(root: Path, name: str, entry_points: str) -> None:
    """An installed package as importlib.metadata sees one: a dist-info folder on sys.path."""
    info = root / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[flowrl.rewards]\n{entry_points}\n")


def _store(root: Path) -> TraceStore:
    store = TraceStore(root)
    for i, answer in enumerate(["4", "the answer is forty-two, twice over"]):
        store.write(
            ExecutionTrace(
                trace_id=f"t{i}",
                timestamp="2026-11-22T10:00:00",
                user_query=f"task {i}",
                final_response=answer,
                success=True,
            )
        )
    return store


def test_a_new_reward_is_one_file_and_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    register_reward("length", "plugins.length_reward:LengthReward", weight=0.25)  # the one line

    engine = RewardEngine()
    assert "length" in engine.names and engine.weights["length"] == 0.25
    engine.close()

    store = _store(tmp_path / "store")
    cfg = tmp_path / "rewards.toml"
    cfg.write_text("[rewards.code_execution]\nenabled = false\n")
    assert main(["score", "--store", str(store.root), "--config", str(cfg)]) == 0
    assert "length" in capsys.readouterr().out
    assert store.get("t0").rewards["length"] == pytest.approx(1 / 20)
    assert store.get("t1").rewards["length"] == 1.0
    assert store.get("t1").reward_details["length"] == {"chars": 35}


def test_register_reward_takes_a_class_and_refuses_nonsense() -> None:
    from plugins.length_reward import LengthReward

    entry = register_reward("length", LengthReward, enabled=False)
    assert entry.load() is LengthReward and entry.weight == 1.0
    assert "length" not in RewardEngine().names  # registered, but off until a config lists it
    with pytest.raises(ConfigError, match="module:Class"):
        register_reward("bad", "no_colon_here")
    with pytest.raises(ConfigError, match="must not be negative"):
        register_reward("bad", LengthReward, weight=-1)


def test_a_new_builtin_is_exported_from_its_registry_line() -> None:
    import flowrl.rewards

    for name in config.BUILTIN_REWARDS:
        entry = REGISTRY[name]
        assert getattr(flowrl.rewards, entry.class_name) is entry.load()
        assert entry.class_name in flowrl.rewards.__all__
    assert {"RewardEngine", "ScoreSummary", "score_store", "register_reward"} <= set(flowrl.rewards.__all__)


def test_installed_plugin_is_registered_enabled_with_its_default_weight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_distribution(tmp_path, "fakeplug", "length = plugins.length_reward:LengthReward")
    monkeypatch.syspath_prepend(str(tmp_path))

    assert "length" in reward_names()
    assert REGISTRY["length"].plugin == "fakeplug" and REGISTRY["length"].weight == 0.5
    engine = RewardEngine()
    assert engine.weights["length"] == 0.5
    engine.close()
    off = tmp_path / "off.toml"
    off.write_text("[rewards.length]\nenabled = false\nmax_chars = 10\n")
    assert not load_config(off).rewards["length"].enabled  # how a user turns an installed plugin off


def test_plugins_are_loaded_once_on_first_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "length" not in reward_names()  # looked up now, before the package exists
    _fake_distribution(tmp_path, "fakeplug", "length = plugins.length_reward:LengthReward")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "length" not in reward_names()
    monkeypatch.setattr(config, "_plugins_loaded", False)
    assert "length" in reward_names()


def test_broken_plugin_is_skipped_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _fake_distribution(
        tmp_path, "brokenplug", "broken = plugins.no_such_module:Nothing\nlength = plugins.length_reward:LengthReward"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="flowrl"):
        names = reward_names()
        reward_names()
    assert "broken" not in names and "length" in names  # the package's good reward still loads
    warnings = [r.getMessage() for r in caplog.records if "broken" in r.getMessage()]
    assert len(warnings) == 1
    assert (
        "brokenplug" in warnings[0] and "ModuleNotFoundError" in warnings[0] and "plugins.no_such_module" in warnings[0]
    )

    store = _store(tmp_path / "store")
    assert main(["score", "--store", str(store.root)]) == 0  # never crashes `flowrl score`
    assert "length" in store.get("t0").rewards


def test_plugin_cannot_take_a_builtin_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _fake_distribution(tmp_path, "squatter", "format = plugins.length_reward:LengthReward")
    monkeypatch.syspath_prepend(str(tmp_path))
    builtin = REGISTRY["format"]
    with caplog.at_level(logging.WARNING, logger="flowrl"):
        reward_names()
    assert REGISTRY["format"] is builtin
    assert any(
        "'format'" in r.getMessage() and "squatter" in r.getMessage() and "built-in" in r.getMessage()
        for r in caplog.records
    )


def test_plugin_that_is_not_a_reward_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _fake_distribution(tmp_path, "oddplug", "odd = plugins.length_reward:answer_text")
    monkeypatch.syspath_prepend(str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="flowrl"):
        assert "odd" not in reward_names()
    assert any("not a flowrl.rewards.Reward subclass" in r.getMessage() for r in caplog.records)


# -- max_error_rate in the reward config -----------------------------------------------------------------------


def test_max_error_rate_is_read_from_the_config(tmp_path: Path) -> None:
    path = tmp_path / "rewards.toml"
    path.write_text("max_error_rate = 0.25\n")
    assert load_config(path).max_error_rate == 0.25
    assert RewardEngine.from_config(path).max_error_rate == 0.25
    path.write_text("threshold = 0.6\n")
    assert load_config(path).max_error_rate is None  # flowrl score's default then applies


@pytest.mark.parametrize("value", ["1.5", "-0.1", '"5%"', "true"])
def test_max_error_rate_is_validated(tmp_path: Path, value: str) -> None:
    path = tmp_path / "rewards.toml"
    path.write_text(f"max_error_rate = {value}\n")
    with pytest.raises(ConfigError, match=r"rewards.toml: max_error_rate: use a number between 0 and 1"):
        load_config(path)


def test_score_takes_the_flag_then_the_config_key_then_the_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from plugins.length_reward import LengthReward

    class Crashing(LengthReward):
        def score(self, trace):
            if trace.trace_id == "t0":
                raise ValueError("kaputt")
            return super().score(trace)

    register_reward("length", LengthReward)
    register_reward("crashing", Crashing)
    store = _store(tmp_path / "store")
    cfg = tmp_path / "rewards.toml"
    only = "include_defaults = false\n[rewards.length]\n[rewards.crashing]\n"
    cfg.write_text(only)  # 1 error in 4 results: over the default 1%
    assert main(["score", "--store", str(store.root), "--config", str(cfg)]) == 2
    assert "budget 1%" in capsys.readouterr().out
    cfg.write_text("max_error_rate = 0.3\n" + only)
    assert main(["score", "--store", str(store.root), "--config", str(cfg), "--max-error-rate", "0.1"]) == 2
    assert "budget 10%" in capsys.readouterr().out  # the flag wins
    assert main(["score", "--store", str(store.root), "--config", str(cfg)]) == 0
    assert "errors: 1 of 4 results (25.0%, budget 30%)" in capsys.readouterr().out
