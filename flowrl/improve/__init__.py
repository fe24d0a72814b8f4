"""`flowrl improve`: the collect -> score -> select -> train -> eval rounds, for any agent (the example agent's
factory, tasks and grader are in `flowrl.demo.example_agents`)."""

from __future__ import annotations

from flowrl._lazy import lazy_exports

_LAZY: dict[str, str] = {
    "improve": "flowrl.improve.loop",
    "Improve": "flowrl.improve.loop",
    "ImproveConfig": "flowrl.improve.config",
    "ImproveError": "flowrl.improve.config",
    "Policy": "flowrl.engines.policy",
    "RoundResult": "flowrl.improve.loop",
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
