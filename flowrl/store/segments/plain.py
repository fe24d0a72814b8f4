"""Plain patches: side records that set only scores and labels, merged onto a segment's columns in bulk.

A scored store has a patch per trace (`flowrl score`: `reward_score`, `rewards`, `reward_details`, `label`,
`label_source`), and a build reads every trace's label and score: merged one trace at a time (its records
found, parsed and applied as `sidecar.apply` does), that was ~35 µs a trace, more than the rest of the build.
A patch is *plain* when it sets only the fields below, with values the trace model takes. `SideView` reads what
a plain patch sets among the segment's columns (`label`, `label_source`, `manual_review`, `reward_score`;
`rewards` is read when used) as it lists the store, and `merge_columns` merges a segment's rows at once, as
`sidecar.merge_patch` would: the patch's values win, a person's label stays against a patch that is not manual.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

# the columns a plain patch's values are merged onto, as a build reads them
COLUMNS = ("label", "label_source", "manual_review", "reward_score", "rewards")
# a column value's code (0: the patch does not set it)
LABELS: tuple[Any, ...] = (None, None, False, True)
SOURCES: tuple[Any, ...] = (None, None, "manual", "engine")


# the fields a plain patch may set: the columns, and fields no column a build reads depends on (and its own id)
FIELDS = (*COLUMNS, "review_notes", "reward_details", "success", "status", "facts", "trace_id")
_NUMBERS = (int, float)  # by exact type: JSON's values (and the columns') are never subclasses; a bool is not one


def is_plain(fields: dict[str, Any]) -> bool:
    """Whether `fields` (a patch's, or a merged trace's) set only `FIELDS`, with values the trace model takes."""
    return codes(fields) is not None


def codes(fields: dict[str, Any]) -> tuple[int, float] | None:  # noqa: C901  # one branch per stored label and outcome form
    """What plain `fields` set among `COLUMNS` but rewards, or None when they are not plain: the label, label source
    and review flag's codes in one byte (2 bits each: 0 not set, else the index into `LABELS`/`SOURCES`, 2/3 for
    False/True), and the score (NaN when not set or None: JSON has no NaN). It runs for every side record a listing
    reads: a lookup per column, not a loop over the fields."""
    get, code, score, seen = fields.get, 0, math.nan, 0
    label = get("label", _ABSENT)
    if label is not _ABSENT:
        if label is not None and type(label) is not bool:
            return None
        code, seen = LABELS.index(label, 1), 1
    source = get("label_source", _ABSENT)
    if source is not _ABSENT:
        if source is not None and source != "manual" and source != "engine":
            return None
        code, seen = code | SOURCES.index(source, 1) << 2, seen + 1
    review = get("manual_review", _ABSENT)
    if review is not _ABSENT:
        if type(review) is not bool:
            return None
        code, seen = code | (3 if review else 2) << 4, seen + 1
    value = get("reward_score", _ABSENT)
    if value is not _ABSENT:
        if value is not None:
            if type(value) not in _NUMBERS:
                return None
            score = float(value)
        seen += 1
    rewards = get("rewards", _ABSENT)
    if rewards is not _ABSENT:
        if type(rewards) is not dict:
            return None
        for reward in rewards.values():  # keys: JSON's are strings
            if reward is not None and type(reward) not in _NUMBERS:
                return None
        seen += 1
    others = len(fields) - seen
    if others:
        details = get("reward_details", _ABSENT)  # what `flowrl score` sets besides the columns
        if details is not _ABSENT:
            if details is not None and type(details) is not dict:
                return None
            others -= 1
        if others and not all(_OTHERS.get(name, _no)(fields[name]) for name in fields.keys() - _SEEN):
            return None
    return code, score


_ABSENT = object()


def _no(value: Any) -> bool:
    return False


_SEEN = {*COLUMNS, "reward_details"}
_OTHERS: dict[str, Callable[[Any], bool]] = {  # the rest of `FIELDS`, and what each takes
    "review_notes": lambda v: v is None or type(v) is str,
    "status": lambda v: v is None or type(v) is str,
    "success": lambda v: v is None or type(v) is bool,
    "facts": lambda v: v is None,
    "trace_id": lambda v: True,  # a patch's own id, never applied
}


def float_rewards(rewards: dict[str, Any]) -> dict[str, float | None]:
    """A plain `rewards` dict as the trace model holds it: its numbers as floats."""
    return {name: None if value is None else float(value) for name, value in rewards.items()}


def _objects(values: tuple[Any, ...]) -> Any:
    import numpy as np

    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


LABEL_OBJECTS, SOURCE_OBJECTS = _objects(LABELS), _objects(SOURCES)  # numpy object arrays, indexed by code
