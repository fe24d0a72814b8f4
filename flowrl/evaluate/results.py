"""The eval JSON: per-task outcomes first, every figure derived from them, and a check that it still is.

`flowrl eval --json OUT` and `flowrl improve` (`DIR/round-<r>/eval.json`) write exactly this, no other key:

    {"tasks": [{"task_id": "...", "outcomes": {"<arm>": true|false}, "family": "mulsub"}],
     "arms": {"<arm>": {"n": 150, "successes": 18, "rate": 0.12, "ci95": [lo, hi]}},
     "comparisons": [{"a": "base", "b": "<arm>", "both": 0, "only_a": 0, "only_b": 0, "neither": 0,
                      "mcnemar_p": 0.0, "diff": 0.0, "diff_ci95": [lo, hi]}],
     "families": {"mulsub": {"unseen": true, "arms": {"<arm>": {"n": ..., "successes": ..., ...}}}},
     "subsets": {"seen": {"arms": {...}, "comparisons": [...]}, "unseen": {"arms": {...}, "comparisons": [...]}}}

- `ci95`: the Wilson 95% interval of the arm's rate (`stats.wilson_interval`).
- Comparisons: every arm against the base, then any other pair asked for (`pairs`: a round against its control).
- `family` (optional, per task): the task's family (`mulsub`, `capital`, ...). When tasks have one, `families`
  gives each family's rate per arm and whether it was `unseen` (kept out of training: `--hold-out-families`),
  and, when some family is unseen, `subsets` gives the arms and comparisons over the tasks of families seen in
  training and over the unseen ones apart. Files without families have neither key.
- A comparison pairs arm `b` with the base `a` task by task: `both`/`only_a`/`only_b`/`neither` count the
  tasks right in both, only one, or neither; `mcnemar_p` is McNemar's exact two-sided p on the discordant
  tasks; `diff` = rate(b) - rate(a) and `diff_ci95` its percentile bootstrap interval over tasks with
  `stats.N_BOOT` (10,000) resamples from seed `stats.SEED` (0). The file has no room for the seed, so it is
  fixed: `verify` recomputes the interval with the same seed and gets the same numbers (for one numpy version:
  numpy does not promise its random streams across versions).

`verify(data)` recomputes every figure from the per-task outcomes and lists what differs: counts must match
exactly, floats within `TOLERANCE` (1e-9, far below any printed digit, far above float noise).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from flowrl.errors import ConfigError, FlowRLError
from flowrl.evaluate.stats import SEED, mcnemar_exact, paired_bootstrap_diff, wilson_interval
from flowrl.store.files import atomic_write_bytes

TOLERANCE = 1e-9


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _Task(_Strict):
    task_id: StrictStr
    outcomes: dict[str, StrictBool]
    family: StrictStr | None = None


class _Arm(_Strict):
    n: StrictInt
    successes: StrictInt
    rate: float
    ci95: tuple[float, float]


class _Comparison(_Strict):
    a: StrictStr
    b: StrictStr
    both: StrictInt
    only_a: StrictInt
    only_b: StrictInt
    neither: StrictInt
    mcnemar_p: float
    diff: float
    diff_ci95: tuple[float, float]


class _Family(_Strict):
    unseen: StrictBool
    arms: dict[str, _Arm]


class _Subset(_Strict):
    arms: dict[str, _Arm]
    comparisons: list[_Comparison]


class _EvalFile(_Strict):
    tasks: list[_Task]
    arms: dict[str, _Arm]
    comparisons: list[_Comparison] = Field(default_factory=list)
    families: dict[str, _Family] | None = None
    subsets: dict[str, _Subset] | None = None


_KEYS, _OPTIONAL = {"tasks", "arms", "comparisons"}, {"families", "subsets"}
SUBSETS = ("seen", "unseen")


def shape_error(data: Any) -> str | None:
    """Why `data` is not an eval JSON (the first problem, one line), or None when its shape is right."""
    if not isinstance(data, dict) or not _KEYS <= set(data) <= _KEYS | _OPTIONAL:
        keys = sorted(data) if isinstance(data, dict) else type(data).__name__
        return f"expected the keys tasks, arms, comparisons (and families, subsets), got {keys}"
    if data.get("subsets") is not None and set(data["subsets"]) - set(SUBSETS):
        return f"subsets: expected {', '.join(SUBSETS)}, got {sorted(data['subsets'])}"
    try:  # JSON mode: lists are read as the pairs they stand for, ints as floats, nothing else is coerced
        _EvalFile.model_validate_json(json.dumps(data, allow_nan=False))
    except ValueError as exc:  # NaN/inf, or a value json cannot write
        if not isinstance(exc, ValidationError):
            return str(exc)
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        return f"{where}: {err['msg']}" if where else err["msg"]
    return None


def summarize(
    outcomes: dict[str, dict[str, bool]],
    *,
    base: str = "base",
    seed: int = SEED,
    pairs: list[tuple[str, str]] | tuple[()] = (),
    families: dict[str, str] | None = None,
    unseen: set[str] | frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """The eval JSON for task_id -> arm -> success: every arm's rate with its interval, every other arm against `base`,
    then each (a, b) in `pairs`. `families`: task_id -> family (tasks missing from it have none); `unseen`: the
    families kept out of training.

    Every task must have every arm (arms are paired task by task). Arms keep the order they first appear in."""
    if not outcomes:
        raise ConfigError("no task outcomes to summarise: run the arms on at least one held-out task")
    arms: list[str] = []
    for per_arm in outcomes.values():
        arms.extend(a for a in per_arm if a not in arms)
    if base not in arms:
        raise ConfigError(f"no base arm {base!r} among the arms {arms}: run the base model too, or name its arm")
    for a, b in pairs:
        if a not in arms or b not in arms:
            raise ConfigError(f"comparison {b} against {a}: both must be arms (the arms are {arms})")
    families = families or {}
    if set(unseen) - set(families.values()):
        raise ConfigError(f"unseen families {sorted(set(unseen) - set(families.values()))} have no task here")
    tasks = [_task_row(task_id, per_arm, arms, families.get(task_id)) for task_id, per_arm in outcomes.items()]
    data = _figures(tasks, arms, base, list(pairs), seed)
    named = sorted({t["family"] for t in tasks if "family" in t})
    if named:
        data["families"] = {
            f: {"unseen": f in unseen, "arms": _figures([t for t in tasks if t.get("family") == f], arms)["arms"]}
            for f in named
        }
    if unseen:
        data["subsets"] = {}
        for subset in SUBSETS:
            part = [t for t in tasks if (t.get("family") in unseen) == (subset == "unseen")]
            if part:
                data["subsets"][subset] = _figures(part, arms, base, list(pairs), seed)
    return {"tasks": tasks, **data}


def _task_row(task_id: str, per_arm: dict[str, bool], arms: list[str], family: str | None) -> dict[str, Any]:
    """A task's entry: its outcome in every arm (refused when one is missing or not a bool), its family if any."""
    for arm in arms:
        if arm not in per_arm:
            raise ConfigError(
                f"task {task_id!r} has no outcome for arm {arm!r}: "
                "run every arm on every task (arms are compared task by task)"
            )
        if not _is_bool(per_arm[arm]):
            raise ConfigError(f"task {task_id!r}, arm {arm!r}: the outcome must be true or false, got {per_arm[arm]!r}")
    task: dict[str, Any] = {"task_id": str(task_id), "outcomes": {arm: bool(per_arm[arm]) for arm in arms}}
    if family is not None:
        task["family"] = str(family)
    return task


def _figures(
    tasks: list[dict[str, Any]],
    arms: list[str],
    base: str | None = None,
    pairs: list[Any] | None = None,
    seed: int = SEED,
) -> dict[str, Any]:
    """Each arm's rate over `tasks`; with a `base`, the comparisons against it and of `pairs`."""
    column = {arm: [t["outcomes"][arm] for t in tasks] for arm in arms}
    summary: dict[str, Any] = {}
    for arm in arms:
        n, k = len(column[arm]), sum(column[arm])
        lo, hi = wilson_interval(k, n)
        summary[arm] = {"n": n, "successes": k, "rate": k / n, "ci95": [lo, hi]}
    if base is None:
        return {"arms": summary}
    wanted = [(base, arm) for arm in arms if arm != base] + [tuple(p) for p in pairs or []]
    comparisons = [_compare(a, b, column[a], column[b], seed) for a, b in wanted]
    return {"arms": summary, "comparisons": comparisons}


def _compare(name_a: str, name_b: str, a: list[bool], b: list[bool], seed: int) -> dict[str, Any]:
    diff, lo, hi = paired_bootstrap_diff(a, b, seed=seed)
    only_a = sum(x and not y for x, y in zip(a, b))
    only_b = sum(y and not x for x, y in zip(a, b))
    return {
        "a": name_a,
        "b": name_b,
        "both": sum(x and y for x, y in zip(a, b)),
        "only_a": only_a,
        "only_b": only_b,
        "neither": sum(not x and not y for x, y in zip(a, b)),
        "mcnemar_p": mcnemar_exact(only_a, only_b),
        "diff": diff,
        "diff_ci95": [lo, hi],
    }


def verify(data: dict[str, Any], *, seed: int = SEED) -> list[str]:
    """What in `data` does not recompute from its own per-task outcomes: [] when every figure does."""
    problem = shape_error(data)
    if problem:
        return [f"not an eval JSON: {problem}"]
    ids = [t["task_id"] for t in data["tasks"]]
    if len(set(ids)) != len(ids):
        return [f"task ids repeat: {sorted({i for i in ids if ids.count(i) > 1})[:5]}"]
    arms = data["arms"]
    base = _base_of(data)
    pairs = [(c["a"], c["b"]) for c in data["comparisons"] if c["a"] != base]
    unseen = {f for f, v in (data.get("families") or {}).items() if v["unseen"]}
    try:
        fresh = summarize(
            {t["task_id"]: t["outcomes"] for t in data["tasks"]},
            base=base,
            seed=seed,
            pairs=[p for p in pairs if p[0] in arms and p[1] in arms],
            families={t["task_id"]: t["family"] for t in data["tasks"] if t.get("family") is not None},
            unseen=unseen,
        )
    except ConfigError as exc:
        return [str(exc)]
    problems = _diff_figures("", data, fresh, base)
    for key in ("families", "subsets"):
        if (data.get(key) is None) != (fresh.get(key) is None) or set(data.get(key) or {}) != set(fresh.get(key) or {}):
            problems.append(
                f"{key}: stored {sorted(data.get(key) or {})}, the tasks give {sorted(fresh.get(key) or {})}"
            )
    for family in sorted(set(data.get("families") or {}) & set(fresh.get("families") or {})):
        problems += _diff_figures(f"families.{family}.", data["families"][family], fresh["families"][family], base)
    for subset in sorted(set(data.get("subsets") or {}) & set(fresh.get("subsets") or {})):
        problems += _diff_figures(f"subsets.{subset}.", data["subsets"][subset], fresh["subsets"][subset], base)
    return problems


def _base_of(data: dict[str, Any]) -> str:
    """The arm the others are compared with: the `a` of the first comparison (every arm against the base comes
    first), else `base`, else the first arm."""
    if data["comparisons"]:
        return str(data["comparisons"][0]["a"])
    return "base" if "base" in data["arms"] else next(iter(data["arms"]), "base")


def _diff_figures(where: str, stored: dict[str, Any], fresh: dict[str, Any], base: str) -> list[str]:
    """What differs between stored and recomputed arms (and comparisons, when `fresh` has them)."""
    problems: list[str] = []
    if set(stored["arms"]) != set(fresh["arms"]):
        problems.append(f"{where}arms: stored {sorted(stored['arms'])}, the tasks have {sorted(fresh['arms'])}")
    for arm in sorted(set(stored["arms"]) & set(fresh["arms"])):
        problems += _diff(f"{where}arms.{arm}", stored["arms"][arm], fresh["arms"][arm])
    if "comparisons" not in fresh:
        return problems
    have = {(c["a"], c["b"]): c for c in stored.get("comparisons", [])}
    wanted = {(c["a"], c["b"]): c for c in fresh["comparisons"]}
    for key in wanted.keys() - have.keys():
        problems.append(f"{where}comparisons: {key[1]} against {key[0]} is missing")
    for key in have.keys() - wanted.keys():
        problems.append(f"{where}comparisons: {key[1]} against {key[0]} compares an arm that is not there")
    for key in sorted(wanted.keys() & have.keys()):
        problems += _diff(f"{where}comparisons.{key[0]}-vs-{key[1]}", have[key], wanted[key])
    return problems


def write_eval_json(path: Path | str, data: dict[str, Any]) -> None:
    """Write `data` (shape-checked) to `path` atomically: a reader sees the old file or the new one."""
    path = Path(path)
    problem = shape_error(data)
    if problem:
        raise ConfigError(f"refusing to write {path}: not an eval JSON ({problem}); build it with `summarize`")
    atomic_write_bytes(path, (json.dumps(data, indent=1) + "\n").encode("utf-8"))


def read_eval_json(path: Path | str) -> dict[str, Any]:
    """Read an eval JSON; a file that is not one raises FlowRLError in one line naming the file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise FlowRLError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FlowRLError(f"{path} is not valid JSON ({exc}): re-run `flowrl eval --json {path}`") from exc
    problem = shape_error(data)
    if problem:
        raise FlowRLError(f"{path} is not an eval JSON ({problem}): re-run `flowrl eval --json {path}`")
    return data


def format_table(data: dict[str, Any]) -> list[str]:
    """The lines a CLI prints: one per arm (n, successes, rate and interval), then one per comparison."""
    width = max([len("arm"), *(len(a) for a in data["arms"])])
    lines = [f"{'arm':<{width}}  {'n':>5}  {'right':>5}  {'rate':>6}  95% CI (Wilson)"]
    for arm, s in data["arms"].items():
        lo, hi = s["ci95"]
        lines.append(
            f"{arm:<{width}}  {s['n']:>5}  {s['successes']:>5}  {_pct(s['rate']):>6}  [{_pct(lo)}, {_pct(hi)}]"
        )
    for c in data["comparisons"]:
        lo, hi = c["diff_ci95"]
        lines.append(
            f"{c['b']} vs {c['a']}: both {c['both']}, only {c['a']} {c['only_a']}, only {c['b']} "
            f"{c['only_b']}, neither {c['neither']}; McNemar exact p = {c['mcnemar_p']:.3g}; "
            f"difference {100 * c['diff']:+.1f} points [{100 * lo:+.1f}, {100 * hi:+.1f}] (bootstrap 95%)"
        )
    return lines + format_families(data)


def format_families(data: dict[str, Any]) -> list[str]:
    """One line per family (right of n in each arm, "unseen" for those never trained on), then the seen and
    unseen subsets with each comparison's McNemar p: [] for a file without families."""
    lines = []
    for family, figures in (data.get("families") or {}).items():
        arms = ", ".join(f"{arm} {s['successes']}/{s['n']}" for arm, s in figures["arms"].items())
        lines.append(f"family {family}{' (unseen)' if figures['unseen'] else ''}: {arms}")
    for subset, figures in (data.get("subsets") or {}).items():
        arms = ", ".join(f"{arm} {_pct(s['rate'])}" for arm, s in figures["arms"].items())
        tests = "; ".join(
            f"{c['b']} vs {c['a']} {100 * c['diff']:+.1f} points, p = {c['mcnemar_p']:.3g}"
            for c in figures["comparisons"]
        )
        n = next(iter(figures["arms"].values()))["n"]
        lines.append(f"{subset} families, n = {n}: {arms}" + (f"; {tests}" if tests else ""))
    return lines


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool) or type(value).__name__ == "bool_"  # numpy's bool passes, 0/1 does not


def _diff(where: str, stored: dict[str, Any], fresh: dict[str, Any]) -> list[str]:
    out = []
    for key, want in fresh.items():
        got = stored.get(key)
        if isinstance(want, list):
            ok = isinstance(got, list) and len(got) == len(want) and all(_close(g, w) for g, w in zip(got, want))
        elif isinstance(want, float):
            ok = _close(got, want)
        else:
            ok = got == want and type(got) is type(want)
        if not ok:
            out.append(f"{where}.{key}: stored {got!r}, recomputed {want!r}")
    return out


def _close(got: Any, want: float) -> bool:
    return isinstance(got, (int, float)) and not isinstance(got, bool) and abs(got - want) <= TOLERANCE
