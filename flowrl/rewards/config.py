"""The reward engine's configuration file (TOML or YAML) and the registry of reward names.

```toml
threshold = 0.6            # get_binary_label: combined score >= threshold is "good"
include_defaults = true    # false: only the rewards listed below

[rewards]
format = 1.0               # shorthand: just a weight

[rewards.efficiency]
weight = 0.5
max_tool_calls = 8         # every other key is an option of that reward's constructor

[rewards.code_execution]
enabled = false            # not computed at all; weight = 0 computes and records it but leaves it out of the mean

[rewards.judge]
enabled = true
model = "gpt-4.1-mini"
cache_dir = "judge-cache"  # relative paths are relative to this file
```

Every mistake is a ConfigError naming the file and the key: an unknown reward, a negative or non-numeric
weight, an option the reward does not take, a judge with no model.
"""

from __future__ import annotations

import importlib
import inspect
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowrl.errors import ConfigError
from flowrl.facts import CORRECTNESS as CORRECTNESS  # re-exported: engine.py and tests read it here
from flowrl.facts import DEFAULT_THRESHOLD

# name -> (module, class, default weight, enabled by default). The style rewards weigh what toolboxv2's rl module
# gave them; the correctness rewards outweigh them (see CORRECTNESS and engine.py): task_completion weighs more than
# every style reward together (6.5, or 8.5 with learned and judge enabled), reference_answer more than those and
# task_completion together (18.5).
REGISTRY: dict[str, tuple[str, str, float, bool]] = {
    "code_execution": ("flowrl.rewards.code_execution", "CodeExecutionReward", 2.0, True),
    "syntax": ("flowrl.rewards.syntax", "SyntaxValidationReward", 1.0, True),
    "tool_success": ("flowrl.rewards.tool_success", "ToolSuccessReward", 2.0, True),
    "task_completion": ("flowrl.rewards.task_completion", "TaskCompletionReward", 10.0, True),
    "efficiency": ("flowrl.rewards.efficiency", "EfficiencyReward", 0.5, True),
    "format": ("flowrl.rewards.format", "FormatComplianceReward", 1.0, True),
    "reference_answer": ("flowrl.rewards.reference", "ReferenceAnswerReward", 20.0, True),
    "learned": ("flowrl.rewards.learned", "LearnedReward", 1.0, False),
    "judge": ("flowrl.rewards.judge", "LLMJudgeReward", 1.0, False),
}
DEFAULT_WEIGHTS: dict[str, float] = {name: spec[2] for name, spec in REGISTRY.items() if spec[3]}
# CORRECTNESS (the rewards that say whether the run got the task right, the one that decides first) and
# DEFAULT_THRESHOLD (the label's) belong to the label rule in flowrl.facts.
# toolboxv2's rl-module weights, where style can outvote correctness: to reproduce its scores
# (`RewardEngine(weights=TOOLBOXV2_WEIGHTS)`, or the same numbers in a config file; see docs/rewards.md).
TOOLBOXV2_WEIGHTS: dict[str, float] = {**DEFAULT_WEIGHTS, "task_completion": 1.5, "reference_answer": 2.0}
PATH_OPTIONS: dict[str, tuple[str, ...]] = {"learned": ("model",), "judge": ("cache_dir",)}
_TOP_KEYS = ("threshold", "include_defaults", "rewards")


@dataclass
class RewardSpec:
    name: str
    weight: float
    enabled: bool = True
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class EngineConfig:
    rewards: dict[str, RewardSpec]
    threshold: float = DEFAULT_THRESHOLD
    source: str = "<defaults>"


def reward_class(name: str) -> type:
    """The class registered under `name` (imported on first use)."""
    module, cls, _, _ = REGISTRY[name]
    return getattr(importlib.import_module(module), cls)


def default_config() -> EngineConfig:
    return EngineConfig({n: RewardSpec(n, w, on) for n, (_, _, w, on) in REGISTRY.items()})


def read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the reward config: {exc.strerror or exc}") from exc
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            raise ConfigError(f"{path}: unknown config format {suffix or '(no suffix)'}: use .toml, .yaml or .yml")
    except ConfigError:
        raise
    except Exception as exc:  # tomllib.TOMLDecodeError, yaml.YAMLError
        raise ConfigError(f"{path}: not valid {suffix.lstrip('.').upper()}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the reward config must be a table/mapping at the top")
    return data


def _weight(path: Path, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{path}: {key}: the weight must be a number, got {value!r}")
    if value < 0:
        raise ConfigError(f"{path}: {key}: the weight must not be negative, got {value}")
    return float(value)


def _check_options(path: Path, name: str, options: dict[str, Any]) -> None:
    if not options:
        return
    try:
        cls = reward_class(name)
    except ImportError:
        return  # reported when the engine builds it
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    for key in options:
        if key not in params or key == "self":
            known = ", ".join(p for p in params if p != "self") or "none"
            raise ConfigError(f"{path}: rewards.{name}.{key}: the {name} reward has no option {key!r} (options: {known})")


def load_config(path: str | Path) -> EngineConfig:
    """Read and check a reward config file. Raises ConfigError naming the file and the key at fault."""
    path = Path(path).expanduser()
    data = read_file(path)
    for key in data:
        if key not in _TOP_KEYS:
            raise ConfigError(f"{path}: {key}: unknown setting (known: {', '.join(_TOP_KEYS)})")
    include_defaults = data.get("include_defaults", True)
    if not isinstance(include_defaults, bool):
        raise ConfigError(f"{path}: include_defaults: use true or false, got {include_defaults!r}")
    threshold = data.get("threshold", DEFAULT_THRESHOLD)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1:
        raise ConfigError(f"{path}: threshold: use a number between 0 and 1, got {threshold!r}")
    cfg = default_config()
    if not include_defaults:
        for spec in cfg.rewards.values():
            spec.enabled = False
    cfg.threshold, cfg.source = float(threshold), str(path)
    rewards = data.get("rewards") or {}
    if not isinstance(rewards, dict):
        raise ConfigError(f"{path}: rewards: must be a table of reward names")
    for name, entry in rewards.items():
        if name not in REGISTRY:
            raise ConfigError(f"{path}: rewards.{name}: unknown reward {name!r} (known: {', '.join(REGISTRY)})")
        spec = cfg.rewards[name]
        spec.enabled = True
        if isinstance(entry, dict):
            entry = dict(entry)
            if "weight" in entry:
                spec.weight = _weight(path, f"rewards.{name}.weight", entry.pop("weight"))
            enabled = entry.pop("enabled", True)
            if not isinstance(enabled, bool):
                raise ConfigError(f"{path}: rewards.{name}.enabled: use true or false, got {enabled!r}")
            spec.enabled = enabled
            for key in PATH_OPTIONS.get(name, ()):
                if isinstance(entry.get(key), str):
                    entry[key] = str((path.parent / Path(entry[key]).expanduser()).resolve())
            _check_options(path, name, entry)
            spec.options = entry
        else:
            spec.weight = _weight(path, f"rewards.{name}", entry)
    judge = cfg.rewards["judge"]
    if judge.enabled and not judge.options.get("model") and not os.environ.get("FLOWRL_JUDGE_MODEL"):
        raise ConfigError(f"{path}: rewards.judge.model: the judge needs a model: set it here or in FLOWRL_JUDGE_MODEL")
    return cfg
