"""Evaluation: a trained model (or adapter) against its base on held-out data, scored by the reward engine.

`evaluate(...)` (`flowrl eval`) answers the held-out prompts of a dataset greedily with each model and reports
the rewards side by side. It sits above `flowrl.train` (it reads datasets the trainer reads) and beside
`flowrl.export`; neither imports it.
"""

from __future__ import annotations

from flowrl._lazy import lazy_exports

_LAZY: dict[str, str] = {
    "evaluate": "flowrl.evaluate.prompts",
    "EvalReport": "flowrl.evaluate.prompts",
    "load_prompts": "flowrl.evaluate.prompts",
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
