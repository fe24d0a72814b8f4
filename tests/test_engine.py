"""RewardEngine: combining, groups, labels, and the config file."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from flowrl.errors import ConfigError
from flowrl.rewards.base import Reward, RewardResult
from flowrl.rewards.config import DEFAULT_WEIGHTS, load_config
from flowrl.rewards.engine import RewardEngine
from flowrl.rewards.learned import LearnedReward
from flowrl.trace.load import load_trace
from flowrl.trace.schema import ExecutionTrace

RL_TRACES = Path(__file__).parent / "fixtures" / "flowagent-0.1.28" / "rendering" / "rl_traces" / "2026-11-22"


class Fixed(Reward):
    def __init__(self, name: str, value: float | None) -> None:
        self.name, self.value = name, value

    def score(self, trace):
        return RewardResult(self.value, {"fixed": True})


class Broken(Reward):
    name = "broken"

    def score(self, trace):
        raise RuntimeError("kaputt")


class BrokenBatch(Reward):
    name = "broken_batch"

    def score_batch(self, traces):
        raise RuntimeError("whole batch failed")


def no_code_config(tmp_path: Path, body: str = "") -> Path:
    path = tmp_path / "rewards.toml"
    path.write_text("[rewards.code_execution]\nenabled = false\n" + body)
    return path


def test_default_weights_are_toolboxv2s_style_with_dominant_correctness():
    assert DEFAULT_WEIGHTS == {
        "code_execution": 2.0,
        "syntax": 1.0,
        "tool_success": 2.0,
        "task_completion": 10.0,
        "efficiency": 0.5,
        "format": 1.0,
        "reference_answer": 20.0,
        "host_outcome": 40.0,
    }  # see engine.py's docstring


def test_default_engine_includes_code_execution():
    engine = RewardEngine()
    try:
        assert engine.names == [
            "code_execution",
            "syntax",
            "tool_success",
            "task_completion",
            "efficiency",
            "format",
            "reference_answer",
            "host_outcome",
        ]
        assert engine.weights["code_execution"] == 2.0
        from flowrl.rewards import CodeExecutionReward

        assert isinstance(engine.rewards["code_execution"], CodeExecutionReward)
        results = engine.compute_all(load_trace(json.loads((RL_TRACES / "0498911e921f.json").read_text())))
        assert set(results) == set(engine.names)
    finally:
        engine.close()


def test_compute_combined_is_weighted_mean_over_values():
    engine = RewardEngine(
        {"a": Fixed("a", 1.0), "b": Fixed("b", 0.0), "c": Fixed("c", None)}, {"a": 3.0, "b": 1.0, "c": 5.0}
    )
    results = engine.compute_all(ExecutionTrace())
    assert results["c"].value is None
    assert engine.compute_combined(results) == pytest.approx(0.75)
    assert engine.compute_combined(ExecutionTrace()) == pytest.approx(0.75)
    assert engine.compute_combined({"a": 0.5, "b": None}) == pytest.approx(0.5)


def test_zero_weight_is_recorded_but_not_combined():
    engine = RewardEngine({"a": Fixed("a", 1.0), "b": Fixed("b", 0.0)}, {"a": 1.0, "b": 0.0})
    results = engine.compute_all(ExecutionTrace())
    assert results["b"].value == 0.0
    assert engine.compute_combined(results) == 1.0


def test_all_none_gives_no_score_and_no_label():
    engine = RewardEngine({"a": Fixed("a", None)}, {"a": 1.0})
    assert engine.compute_combined(ExecutionTrace()) is None
    assert engine.get_binary_label(None) is None
    assert engine.get_binary_label(ExecutionTrace()) is None


def test_binary_label_threshold():
    engine = RewardEngine({"a": Fixed("a", 0.6)}, {"a": 1.0})
    assert engine.get_binary_label(0.6) is True
    assert engine.get_binary_label(0.59) is False
    assert engine.get_binary_label(0.7, threshold=0.8) is False
    assert engine.get_binary_label(ExecutionTrace()) is True


def test_compute_for_group_z_scores():
    engine = RewardEngine({"a": Fixed("a", 0.5)}, {"a": 1.0})
    z = engine.compute_for_group(scores=[1.0, 0.0, None, 0.5])
    assert z[0] == pytest.approx(1.2247, abs=1e-3) and z[1] == pytest.approx(-1.2247, abs=1e-3)
    assert z[2] is None and z[3] == pytest.approx(0.0)
    assert engine.compute_for_group([ExecutionTrace(), ExecutionTrace()]) == [0.0, 0.0]  # equal: no signal
    assert engine.compute_for_group(scores=[None, None]) == [None, None]


def test_compute_for_group_on_fixture_traces(tmp_path):
    engine = RewardEngine.from_config(no_code_config(tmp_path))
    traces = [load_trace(json.loads(p.read_text())) for p in sorted(RL_TRACES.glob("*.json"))]
    z = engine.compute_for_group(traces)
    assert len(z) == 3 and abs(sum(z)) < 1e-9
    assert z[0] == max(z)  # 0498911e921f: the clean run is the best of the three


def test_broken_reward_is_an_error_not_fatal():
    engine = RewardEngine(
        {"ok": Fixed("ok", 1.0), "broken": Broken(), "broken_batch": BrokenBatch()},
        {"ok": 1.0, "broken": 1.0, "broken_batch": 1.0},
    )
    results = engine.compute_all(ExecutionTrace())
    assert results["broken"].value is None and "kaputt" in results["broken"].error
    assert "kaputt" in results["broken"].details["error"]  # kept with the trace's reward_details
    assert results["broken_batch"].value is None and "whole batch failed" in results["broken_batch"].error
    assert results["ok"].error is None
    assert engine.compute_combined(results) is None  # not 1.0, the mean re-weighted over "ok" alone
    assert engine.get_binary_label(results) is None


def test_learned_reward_sees_fresh_values():
    seen = {}

    class Spy(LearnedReward):
        def score(self, trace):
            seen.update(trace.rewards)
            return RewardResult(None)

    engine = RewardEngine({"learned": Spy(), "syntax": Fixed("syntax", 0.25)}, {"learned": 1.0, "syntax": 1.0})
    results = engine.compute_all(ExecutionTrace())
    assert seen == {"syntax": 0.25}
    assert list(results) == ["learned", "syntax"]  # the engine's order, whatever the stages


def test_negative_weight_in_code_is_refused():
    with pytest.raises(ConfigError, match="negative"):
        RewardEngine({"a": Fixed("a", 1.0)}, {"a": -1.0})


# -- config files ---------------------------------------------------------------------------------------


def test_toml_config(tmp_path):
    path = tmp_path / "rewards.toml"
    path.write_text(
        "threshold = 0.7\n[rewards]\nformat = 3\n[rewards.code_execution]\nenabled = false\n"
        "[rewards.efficiency]\nweight = 0.25\nmax_tool_calls = 2\n"
    )
    engine = RewardEngine.from_config(path)
    assert "code_execution" not in engine.names
    assert engine.weights["format"] == 3.0 and engine.weights["efficiency"] == 0.25
    assert engine.rewards["efficiency"].budgets["tool_calls"] == 2
    assert engine.threshold == 0.7 and engine.source == str(path)


def test_yaml_config_with_learned_enabled(tmp_path):
    path = tmp_path / "rewards.yaml"
    path.write_text(
        "include_defaults: false\nrewards:\n  syntax: 1\n  learned:\n    weight: 2\n    model: models/l.json\n"
    )
    engine = RewardEngine.from_config(path)
    assert engine.names == ["syntax", "learned"]
    assert engine.rewards["learned"].model_path == (tmp_path / "models" / "l.json").resolve()


def test_learned_and_judge_off_by_default(tmp_path):
    engine = RewardEngine.from_config(no_code_config(tmp_path))
    assert "learned" not in engine.names and "judge" not in engine.names


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("[rewards.sandboxx]\nweight = 1\n", "rewards.sandboxx: unknown reward 'sandboxx'"),
        ("[rewards.syntax]\nweight = -1\n", "rewards.syntax.weight: the weight must not be negative"),
        ("[rewards]\nsyntax = -0.5\n", "rewards.syntax: the weight must not be negative"),
        ('[rewards.syntax]\nweight = "heavy"\n', "rewards.syntax.weight: the weight must be a number"),
        (
            "[rewards.efficiency]\nmax_tool_call = 3\n",
            "rewards.efficiency.max_tool_call: the efficiency reward has no option",
        ),
        ("[rewards.syntax]\nenabled = 1\n", "rewards.syntax.enabled"),
        ("treshold = 0.5\n", "treshold: unknown setting"),
        ("threshold = 2\n", "threshold: use a number between 0 and 1"),
        ("[rewards.judge]\nenabled = true\n", "rewards.judge.model"),
        ("[rewards.judge]\nmodel = 'm'\nmode = 'sideways'\n", "rewards.judge: judge mode 'sideways'"),
        ("[rewards\n", "not valid TOML"),
    ],
)
def test_config_errors_name_file_and_key(tmp_path, monkeypatch, body, needle):
    monkeypatch.delenv("FLOWRL_JUDGE_MODEL", raising=False)
    path = tmp_path / "bad.toml"
    path.write_text(body)
    with pytest.raises(ConfigError) as info:
        RewardEngine.from_config(path)
    assert str(path) in str(info.value)
    assert needle in str(info.value)


def test_yaml_errors_name_file_and_key(tmp_path):
    path = tmp_path / "bad.yml"
    path.write_text("rewards:\n  nonsense: 1\n")
    with pytest.raises(ConfigError, match=r"bad\.yml: rewards\.nonsense: unknown reward"):
        load_config(path)
    path.write_text("rewards: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YML"):
        load_config(path)


def test_missing_and_unknown_format_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.toml")
    other = tmp_path / "rewards.ini"
    other.write_text("x")
    with pytest.raises(ConfigError, match="use .toml, .yaml or .yml"):
        load_config(other)


def test_judge_model_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWRL_JUDGE_MODEL", "judge-model")
    path = no_code_config(tmp_path, "[rewards.judge]\nweight = 2\ncache_dir = 'cache'\n")
    engine = RewardEngine.from_config(path)
    assert engine.weights["judge"] == 2.0
    judge = engine.rewards["judge"]
    assert judge.client.model == "judge-model"
    assert judge.client.cache_dir == (tmp_path / "cache").resolve()


def _doc_blocks(lang: str) -> list[str]:
    text = (Path(__file__).resolve().parents[1] / "docs" / "rewards.md").read_text()
    return re.findall(rf"^\s*```{lang}\n(.*?)^\s*```", text, re.DOTALL | re.MULTILINE)


def test_documented_example_config_loads(tmp_path):
    path = tmp_path / "rewards.toml"
    path.write_text(next(b for b in _doc_blocks("toml") if "threshold" in b))
    cfg = load_config(path)
    assert cfg.rewards["learned"].enabled and cfg.rewards["judge"].enabled and not cfg.rewards["syntax"].enabled
    assert cfg.rewards["efficiency"].options == {"max_tool_calls": 8, "repeat_penalty": 0.2}
    yaml_path = tmp_path / "rewards.yaml"
    yaml_path.write_text(textwrap.dedent(_doc_blocks("yaml")[0]))
    cfg = load_config(yaml_path)
    assert [n for n, s in cfg.rewards.items() if s.enabled] == ["tool_success", "task_completion"]


def test_documented_provider_snippets_load(tmp_path, monkeypatch):
    monkeypatch.delenv("FLOWRL_JUDGE_MODEL", raising=False)
    snippets = [b for b in _doc_blocks("toml") if b.startswith("[rewards.judge]")]
    assert len(snippets) == 2  # Anthropic-compatible, OpenRouter
    for body in snippets:
        path = tmp_path / "judge.toml"
        path.write_text("include_defaults = false\n" + body)
        engine = RewardEngine.from_config(path)
        assert engine.rewards["judge"].client.model
