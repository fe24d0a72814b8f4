"""The reward engine's configuration file (TOML or YAML) and the registry of reward names.

```toml
threshold = 0.6            # get_binary_label: combined score >= threshold is "good"
include_defaults = true    # false: only the rewards listed below
max_error_rate = 0.01      # flowrl score: past this share of errored results nothing is written (--max-error-rate wins)

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
weight, an option the reward does not take, a judge with no model, an error rate outside 0..1.

REGISTRY is the one table of reward names. A new built-in reward is one module and one line there; a reward
defined elsewhere is one `register_reward(name, "module:Class", weight=...)` call. Installed packages add
rewards through the `flowrl.rewards` entry-point group (`length = "my_pkg.rewards:LengthReward"`), loaded once,
on first use of the table (never at import). The precedence: a built-in name, or one already registered in
code, is never replaced by a plugin (the plugin is refused with a warning); a plugin that fails to import is
skipped with one warning; `register_reward` itself adds or replaces. A plugin is enabled once installed, with
the weight of its class's `default_weight` (else 1), unless its class sets `enabled_by_default = False`; turn it
off with `enabled = false` under `[rewards.NAME]`.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import math
import os
import threading
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

from flowrl.errors import ConfigError
from flowrl.rewards.base import Reward
from flowrl.trace.facts import CORRECTNESS as CORRECTNESS  # re-exported: engine.py and tests read it here
from flowrl.trace.facts import DEFAULT_THRESHOLD

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "flowrl.rewards"


@dataclass(frozen=True, slots=True)
class RegisteredReward:
    """One row of REGISTRY: the reward's class ("module:Class", imported on first use, or the class itself), its
    default weight, whether it runs without a config naming it, and the package that registered it through an
    entry point (None: flowrl itself, or a `register_reward` call)."""

    target: str | type
    weight: float = 1.0
    enabled: bool = True
    plugin: str | None = None
    measures: str = ""  # what a score of 1 says, in a few words (the report shows it beside the name)

    @property
    def module(self) -> str:
        return self.target.partition(":")[0] if isinstance(self.target, str) else self.target.__module__

    @property
    def class_name(self) -> str:
        return self.target.partition(":")[2] if isinstance(self.target, str) else self.target.__qualname__

    def load(self) -> type[Any]:
        if isinstance(self.target, type):
            return self.target
        return getattr(importlib.import_module(self.module), self.class_name)


# name -> where the class is, default weight, enabled by default. The style rewards weigh what toolboxv2's rl module
# gave them; the correctness rewards outweigh them (see CORRECTNESS and engine.py): task_completion weighs more than
# every style reward together (6.5, or 8.5 with learned and judge enabled), reference_answer more than those and
# task_completion together (18.5), and what the host said (host_outcome) more than all of them (38.5). A new
# built-in reward is one line here (flowrl.rewards exports its class).
REGISTRY: dict[str, RegisteredReward] = {
    "code_execution": RegisteredReward(
        "flowrl.rewards.code_execution:CodeExecutionReward", 2.0, measures="the run's code ran without error"
    ),
    "syntax": RegisteredReward("flowrl.rewards.syntax:SyntaxValidationReward", 1.0, measures="its code parses"),
    "tool_success": RegisteredReward(
        "flowrl.rewards.tool_success:ToolSuccessReward", 2.0, measures="its tool calls succeeded"
    ),
    "task_completion": RegisteredReward(
        "flowrl.rewards.task_completion:TaskCompletionReward",
        10.0,
        measures="the run ended normally by its own account; NOT whether the answer is right",
    ),
    "efficiency": RegisteredReward(
        "flowrl.rewards.efficiency:EfficiencyReward", 0.5, measures="within its budgets of calls, turns, tokens"
    ),
    "format": RegisteredReward("flowrl.rewards.format:FormatComplianceReward", 1.0, measures="well-formed replies"),
    "reference_answer": RegisteredReward(
        "flowrl.rewards.reference:ReferenceAnswerReward", 20.0, measures="the answer is the task's reference, unhedged"
    ),
    "host_outcome": RegisteredReward(
        "flowrl.rewards.host_outcome:HostOutcomeReward", 40.0, measures="your host said the run succeeded"
    ),
    "learned": RegisteredReward(
        "flowrl.rewards.learned:LearnedReward", 1.0, enabled=False, measures="a model of your labels says good"
    ),
    "judge": RegisteredReward("flowrl.rewards.judge:LLMJudgeReward", 1.0, enabled=False, measures="an LLM judge"),
    "grounding": RegisteredReward(
        "flowrl.rewards.grounding:GroundingReward", 1.0, enabled=False, measures="the answer rests on tool results"
    ),
}
BUILTIN_REWARDS: tuple[str, ...] = tuple(REGISTRY)
DEFAULT_WEIGHTS: dict[str, float] = {name: entry.weight for name, entry in REGISTRY.items() if entry.enabled}
# CORRECTNESS (the rewards that say whether the run got the task right, the one that decides first) and
# DEFAULT_THRESHOLD (the label's) belong to the label rule in flowrl.trace.facts.
# toolboxv2's rl-module weights, where style can outvote correctness: to reproduce its scores
# (`RewardEngine(weights=TOOLBOXV2_WEIGHTS)`, or the same numbers in a config file; see docs/rewards.md).
TOOLBOXV2_WEIGHTS: dict[str, float] = {**DEFAULT_WEIGHTS, "task_completion": 1.5, "reference_answer": 2.0}
PATH_OPTIONS: dict[str, tuple[str, ...]] = {"learned": ("model",), "judge": ("cache_dir",)}
_TOP_KEYS = ("threshold", "include_defaults", "max_error_rate", "rewards")


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
    max_error_rate: float | None = None  # None: `flowrl score`'s own default, unless --max-error-rate is given


def register_reward(name: str, target: str | type, *, weight: float = 1.0, enabled: bool = True) -> RegisteredReward:
    """Add (or replace) a reward in REGISTRY: `target` is its class or "module:Class" (imported on first use).
    `RewardEngine()`, reward configs and `flowrl score` then know it by `name`."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"register_reward: the name must be a non-empty string, got {name!r}")
    if isinstance(target, str):
        module, _, cls = target.partition(":")
        if not module or not cls:
            raise ConfigError(f"register_reward({name!r}): give the class or 'module:Class', got {target!r}")
    elif not isinstance(target, type):
        raise ConfigError(f"register_reward({name!r}): give the class or 'module:Class', got {target!r}")
    entry = RegisteredReward(target, _weight(Path("register_reward"), name, weight), bool(enabled))
    REGISTRY[name] = entry
    return entry


_plugins_loaded = False
_plugins_lock = threading.RLock()  # reentrant: a plugin module may use the registry while it is imported


def load_plugins() -> None:
    """Register the rewards that installed packages offer under the `flowrl.rewards` entry-point group. Runs once
    per process, on first use of the registry; a plugin that cannot be loaded is logged and skipped."""
    global _plugins_loaded
    with _plugins_lock:
        if _plugins_loaded:
            return
        _plugins_loaded = True
        try:
            found = list(entry_points(group=ENTRY_POINT_GROUP))
        except Exception as exc:  # broken metadata of some installed package: scoring goes on with what flowrl has
            log.warning("flowrl: cannot read the %s entry points, no reward plugins loaded: %s", ENTRY_POINT_GROUP, exc)
            return
        for ep in found:
            _add_plugin(ep)


def _add_plugin(ep: EntryPoint) -> None:
    package = ep.dist.name if ep.dist is not None else "an unknown package"
    taken = REGISTRY.get(ep.name)
    if taken is not None:
        if taken.plugin == package:  # the same package seen twice on the path
            return
        owner = (
            "a built-in reward"
            if ep.name in BUILTIN_REWARDS
            else f"the {taken.plugin} plugin"
            if taken.plugin
            else "a reward registered with register_reward"
        )
        log.warning(
            "flowrl: reward plugin %r from %s is not loaded: %s already has that name, and it wins; the "
            "plugin's package should rename its %s entry point",
            ep.name,
            package,
            owner,
            ENTRY_POINT_GROUP,
        )
        return
    try:
        cls = ep.load()
    except Exception as exc:  # a broken plugin must not stop `flowrl score`
        log.warning(
            "flowrl: reward plugin %r from %s (%s) failed to import and is skipped: %s: %s; fix or uninstall %s",
            ep.name,
            package,
            ep.value,
            type(exc).__name__,
            exc,
            package,
        )
        return
    if not (isinstance(cls, type) and issubclass(cls, Reward)):
        log.warning(
            "flowrl: reward plugin %r from %s is skipped: %s is not a flowrl.rewards.Reward subclass",
            ep.name,
            package,
            ep.value,
        )
        return
    weight = getattr(cls, "default_weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight < 0:
        log.warning(
            "flowrl: reward plugin %r from %s is skipped: default_weight must be a number >= 0, got %r",
            ep.name,
            package,
            weight,
        )
        return
    enabled = getattr(cls, "enabled_by_default", True) is not False
    REGISTRY[ep.name] = RegisteredReward(cls, float(weight), enabled, plugin=package)


def registry() -> dict[str, RegisteredReward]:
    """REGISTRY, with the installed plugins' rewards in it."""
    load_plugins()
    return REGISTRY


def reward_names() -> tuple[str, ...]:
    return tuple(registry())


def reward_class(name: str) -> type[Any]:
    """The class registered under `name` (imported on first use)."""
    entry = registry().get(name)
    if entry is None:
        raise ConfigError(f"unknown reward {name!r} (known: {', '.join(REGISTRY)})")
    return entry.load()


def default_config() -> EngineConfig:
    return EngineConfig({n: RewardSpec(n, e.weight, e.enabled) for n, e in registry().items()})


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
            raise ConfigError(
                f"{path}: rewards.{name}.{key}: the {name} reward has no option {key!r} (options: {known})"
            )


def load_config(path: str | Path) -> EngineConfig:  # noqa: C901  # one check per TOML key, each with its own message
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
    max_error_rate = data.get("max_error_rate")
    if max_error_rate is not None and (
        isinstance(max_error_rate, bool) or not isinstance(max_error_rate, (int, float)) or not 0 <= max_error_rate <= 1
    ):
        raise ConfigError(f"{path}: max_error_rate: use a number between 0 and 1 (0.01 is 1%), got {max_error_rate!r}")
    cfg = default_config()
    cfg.max_error_rate = None if max_error_rate is None else float(max_error_rate)
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
