"""A generated task suite the example agent is graded on, split into parts that never overlap.

`suite(seed)` makes `size` tasks (2,400 by default), the same ones for the same seed, of three kinds:

- **calc**: integer arithmetic a small model does not know by heart, so it needs `exec_code`: products of
  2-3 digit numbers, `a * b + c`, `a * b - c`, `(a + b) * c`, sums and differences of 4-digit numbers;
- **lookup**: one question per entry of the agent's fact tables (`flowrl.demo.agent`: capitals, atomic
  numbers, chemical symbols, whole-number facts), answered by `lookup`; every query names its fact verbatim
  ("What is the capital of Peru?" holds the key "capital of peru");
- **multi**: a number looked up, then computed with, so two tools: "Look up the atomic number of carbon and
  multiply it by 17." (`lookup`, then `exec_code`). Each numeric fact gets one task of each of four forms.

Lookup answers are at least two characters (atomic numbers from neon on, two-letter symbols that are not
English words, facts of 10 or more), so that a stray "I" or "7" in a wrong answer does not pass the grader.

**Families.** Each task has a `family`, its form (`FAMILIES`): calc tasks by expression (`mul`, `mul3`, `muladd`,
`mulsub`, `summul` for "(a + b) * c", `add3`, `sub`), lookups by table (`capital`, `atomic-number`, `symbol`,
`count`), multi-step tasks by what they compute (`multi-mul`, `multi-add`, `multi-muladd`, `multi-subfrom`).
`flowrl improve --hold-out-families` keeps whole families out of training, so eval can report them as unseen.

**Near-duplicates.** A task belongs to a group, and `split` never divides a group:
- calc: the expression with the operands of `+`/`-` and of `*` put in a canonical order, so "347 * 86" and
  "86 * 347" are one task (`canonical`). The generator goes further: no two calc tasks share a pair of
  operands, so "347 * 86" and "347 * 86 + 589" are never both in the suite;
- lookup and multi: the fact. Every task on "atomic number of carbon" (its lookup and its four multi-step
  tasks) is on one side, so the held-out part never asks about a fact a training trace showed.
Tasks of different kinds are not compared otherwise (a multi-step task on carbon is not a duplicate of a
calc task with the same numbers: it needs a lookup first).

**Grading.** `grade(task, text)` is `flowrl.rewards.reference.answer_matches`, the rule of the
`reference_answer` reward, so a task's success in eval and its reward agree. It is strict: an answer that offers
several candidates ("84 or 85") or contradicts itself is wrong (`flowrl.rewards.reference.hedge`).

**References on traces.** `flowrl.demo.tasks.annotate(store, tasks)` records each task's answer on the traces
of its query (`annotate(store, suite())` for the whole suite); `flowrl improve` annotates its own runs by
session id.
"""

from __future__ import annotations

import ast
import hashlib
import random
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from flowrl.demo.agent import CAPITALS, COUNTS, ELEMENTS
from flowrl.demo.tasks import Task
from flowrl.errors import FlowRLError
from flowrl.rewards.reference import answer_matches
from flowrl.trace.facts import query_key

__all__ = [
    "FAMILIES",
    "KINDS",
    "SuiteError",
    "SuiteTask",
    "canonical",
    "check_disjoint",
    "grade",
    "group_of",
    "split",
    "suite",
]

KINDS = ("calc", "lookup", "multi")
# each task's form: calc by its expression, lookup by its table, multi by what it computes with the fact
FAMILIES = {
    "calc": ("mul", "mul3", "muladd", "mulsub", "summul", "add3", "sub"),
    "lookup": ("capital", "atomic-number", "symbol", "count"),
    "multi": ("multi-mul", "multi-add", "multi-muladd", "multi-subfrom"),
}
DEFAULT_SIZE = 2400
DEFAULT_HELD_OUT = 200
# Two-letter symbols that are also English words or common abbreviations: a grader would find them anywhere.
_WORD_SYMBOLS = frozenset({"he", "be", "no", "as", "at", "in", "am", "es", "er", "re", "ho", "pa", "po", "ta"})


class SuiteError(FlowRLError):
    """A suite cannot be split as asked, or its parts overlap."""


@dataclass(frozen=True)
class SuiteTask(Task):
    """A `Task` that also says how it is solved and what it must not be separated from. `key`: the `lookup`
    key it needs ("" for calc); `expression`: the Python `exec_code` runs, with "{x}" where a multi-step task
    puts the looked-up value ("" for lookup); `group`: near-duplicates share it (see the module doc); `family`:
    the task's form (`FAMILIES`)."""

    key: str = ""
    expression: str = ""
    group: str = ""
    family: str = ""


def grade(task: Any, answer: str | None) -> bool:
    """Is `answer` right for `task`? The reference_answer reward's rule: the task's answer appears in the text
    as a whole word or number ("The answer is 84." passes for 84, "841" does not), and the answer commits to it
    ("84 or 85" fails)."""
    return answer_matches(str(task.answer), answer or "")


# ---------------------------------------------------------------------------------------------
# near-duplicates


def canonical(expression: str) -> str:
    """An arithmetic expression with commutative operands in a fixed order: "86 * 347 + 5" and "5 + 347 * 86"
    give the same string. Sums and differences become a sorted list of signed terms, products a sorted list
    of factors; other operators keep their order."""

    def terms(node: ast.AST, sign: str) -> list[str]:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub):
            flip = {"+": "-", "-": "+"}[sign] if isinstance(node.op, ast.Sub) else sign
            return terms(node.left, sign) + terms(node.right, flip)
        return [sign + canon(node)]

    def factors(node: ast.AST) -> list[str]:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            return factors(node.left) + factors(node.right)
        return [canon(node)]

    def canon(node: ast.AST) -> str:
        if isinstance(node, ast.Constant):
            return repr(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return f"neg({canon(node.operand)})"
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub):
            return "sum(" + ",".join(sorted(terms(node, "+"))) + ")"
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            return "prod(" + ",".join(sorted(factors(node))) + ")"
        if isinstance(node, ast.BinOp):
            return f"{type(node.op).__name__}({canon(node.left)},{canon(node.right)})"
        if isinstance(node, ast.Name):
            return node.id
        raise ValueError(f"not an arithmetic expression: {expression!r}")

    return canon(ast.parse(expression, mode="eval").body)


_EXPRESSION = re.compile(r"[\d(][\d\s+\-*/()]*[-+*/][\d\s+\-*/()]*[\d)]")


def group_of(task: Any) -> str:
    """The task's near-duplicate group: `SuiteTask.group` when set; else, for a query with arithmetic in it
    ("What is 12 * 34?"), the canonical expression, so hand-written tasks get the same rule; else the task key
    of its query."""
    if getattr(task, "group", ""):
        return task.group
    for found in sorted(_EXPRESSION.findall(task.query), key=len, reverse=True)[:1]:
        try:
            return f"calc:{canonical(found)}"
        except (SyntaxError, ValueError):
            break
    return f"query:{query_key(task.query)}"


# ---------------------------------------------------------------------------------------------
# the suite

_CALC_QUERIES = ("What is {e}?", "Compute {e}.", "Calculate {e}.", "What does {e} equal?")
# (name, expression, weight, operand ranges); every expression is a positive integer
_CALC_FORMS: tuple[tuple[str, str, int, tuple[tuple[int, int], ...]], ...] = (
    ("mul", "{0} * {1}", 6, ((100, 999), (12, 99))),
    ("mul3", "{0} * {1}", 3, ((100, 999), (100, 999))),
    ("muladd", "{0} * {1} + {2}", 3, ((12, 99), (12, 99), (100, 999))),
    ("mulsub", "{0} * {1} - {2}", 3, ((12, 99), (12, 99), (100, 999))),
    ("summul", "({0} + {1}) * {2}", 2, ((100, 999), (100, 999), (12, 99))),
    ("add3", "{0} + {1} + {2}", 2, ((1000, 9999), (1000, 9999), (1000, 9999))),
    ("sub", "{0} - {1}", 1, ((5000, 9999), (1000, 4999))),
)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _title(name: str) -> str:
    return " ".join(w if w in ("and", "of") else "-".join(p.capitalize() for p in w.split("-")) for w in name.split())


def _evaluate(expression: str) -> int:
    """The value of one of our own integer expressions (digits, + - * and parentheses only)."""
    if not re.fullmatch(r"[\d\s+\-*()]+", expression):
        raise ValueError(f"not an integer expression: {expression!r}")
    return int(eval(expression, {"__builtins__": {}}))


def _calc_tasks(rng: random.Random, n: int) -> list[SuiteTask]:
    tasks: list[SuiteTask] = []
    used: set[tuple[int, int]] = set()
    names, weights = [f[0] for f in _CALC_FORMS], [f[2] for f in _CALC_FORMS]
    forms = {f[0]: f for f in _CALC_FORMS}
    while len(tasks) < n:
        name, template, _, ranges = forms[rng.choices(names, weights)[0]]
        nums = [rng.randint(lo, hi) for lo, hi in ranges]
        expression = template.format(*nums)
        value = _evaluate(expression)
        pairs = set(combinations(sorted(nums), 2))
        if value <= 0 or pairs & used:
            continue  # a negative answer, or two operands shared with a task already made (a near-duplicate)
        used |= pairs
        query = rng.choice(_CALC_QUERIES).format(e=expression)
        tasks.append(
            SuiteTask(
                f"{name}-{'-'.join(map(str, nums))}",
                query,
                str(value),
                "calc",
                expression=expression,
                group=f"calc:{canonical(expression)}",
                family=name,
            )
        )
    return tasks


def _facts() -> list[tuple[str, str, str, str, str]]:
    """(fact key, task id stem, question, answer, family) for every fact the lookup tasks ask about."""
    facts = [
        (f"capital of {c}", f"cap-{_slug(c)}", f"What is the capital of {_title(c)}?", city, "capital")
        for c, city in CAPITALS.items()
    ]
    facts += [
        (f"atomic number of {e}", f"anum-{e}", f"What is the atomic number of {e}?", str(z), "atomic-number")
        for e, (z, _) in ELEMENTS.items()
        if z >= 10
    ]
    facts += [
        (f"chemical symbol of {e}", f"sym-{e}", f"What is the chemical symbol of {e}?", s, "symbol")
        for e, (_, s) in ELEMENTS.items()
        if len(s) == 2 and s.lower() not in _WORD_SYMBOLS
    ]
    facts += [
        (k, f"count-{_slug(k)}", f"What is the number of {k}?", str(v), "count") for k, v in COUNTS.items() if v >= 10
    ]
    return facts


def _numeric_facts() -> list[tuple[str, str, str, int]]:
    """(fact key, id stem, phrase, value) for every whole-number fact a multi-step task computes with."""
    out = [(f"atomic number of {e}", f"anum-{e}", f"the atomic number of {e}", z) for e, (z, _) in ELEMENTS.items()]
    return out + [(k, f"count-{_slug(k)}", f"the number of {k}", v) for k, v in COUNTS.items()]


def _multi_tasks(rng: random.Random) -> list[SuiteTask]:
    tasks = []
    for key, stem, phrase, value in _numeric_facts():
        k, m, big = rng.randint(13, 99), rng.randint(100, 999), value + rng.randint(100, 9999)
        forms = (
            ("mul", f"Look up {phrase} and multiply it by {k}.", f"{{x}} * {k}", (k,)),
            ("add", f"Look up {phrase} and add {m} to it.", f"{{x}} + {m}", (m,)),
            ("muladd", f"Look up {phrase}, multiply it by {k}, then add {m}.", f"{{x}} * {k} + {m}", (k, m)),
            ("subfrom", f"Look up {phrase} and subtract it from {big}.", f"{big} - {{x}}", (big,)),
        )
        for name, query, expression, nums in forms:
            answer = str(_evaluate(expression.format(x=value)))
            tasks.append(
                SuiteTask(
                    f"multi-{name}-{stem}-{'-'.join(map(str, nums))}",
                    query,
                    answer,
                    "multi",
                    key=key,
                    expression=expression,
                    group=f"fact:{key}",
                    family=f"multi-{name}",
                )
            )
    return tasks


def suite(seed: int = 0, *, size: int = DEFAULT_SIZE) -> list[SuiteTask]:
    """`size` distinct tasks, the same for the same seed: every lookup and multi-step task the fact tables
    give, and calc tasks for the rest. Order: calc, lookup, multi."""
    rng = random.Random(f"flowrl-suite-{seed}")
    lookups = [
        SuiteTask(stem, question, answer, "lookup", key=key, group=f"fact:{key}", family=family)
        for key, stem, question, answer, family in _facts()
    ]
    multi = _multi_tasks(rng)
    n_calc = size - len(lookups) - len(multi)
    if n_calc < 1:
        raise SuiteError(f"size {size} leaves no room for calc tasks: use a size above {len(lookups) + len(multi)}")
    return _calc_tasks(rng, n_calc) + lookups + multi


# ---------------------------------------------------------------------------------------------
# the split


def _rank(seed: int, text: str) -> str:
    return hashlib.sha256(f"{seed}\0{text}".encode()).hexdigest()


def _components(tasks: Sequence[Any]) -> dict[str, list[Any]]:
    """Tasks joined when they share a group, a task id or a query (its task key); keyed by a stable name."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for t in tasks:
        labels = [f"group:{group_of(t)}", f"id:{t.task_id}", f"query:{query_key(t.query)}"]
        for label in labels[1:]:
            a, b = sorted((find(labels[0]), find(label)))
            parent[b] = a
    out: dict[str, list[Any]] = {}
    for t in tasks:
        out.setdefault(find(f"group:{group_of(t)}"), []).append(t)
    return out


def _quotas(tasks: Sequence[Any], n: int) -> dict[str, int]:
    """n spread over the kinds in proportion to their sizes (largest remainder)."""
    counts = Counter(t.kind for t in tasks)
    exact = {k: n * c / len(tasks) for k, c in counts.items()}
    quotas = {k: int(v) for k, v in exact.items()}
    for k in sorted(exact, key=lambda k: (quotas[k] - exact[k], k))[: n - sum(quotas.values())]:
        quotas[k] += 1
    return quotas


def split(tasks: Iterable[Any], held_out: int = DEFAULT_HELD_OUT, seed: int = 0) -> tuple[list[Any], list[Any]]:
    """(train, held_out): at least `held_out` tasks held out, every kind in proportion to its share of the
    suite, whole near-duplicate groups only (`group_of`; tasks sharing an id or a query count as one group).
    Groups are taken in the order of a hash of their name and the seed, so the same tasks and seed give the
    same split, and a task's side does not depend on the order of the list. Each part comes in hash order of
    its task ids, so any prefix is a fair sample of it. Raises SuiteError when the parts would overlap."""
    tasks = list(tasks)
    if not 0 <= held_out < len(tasks):
        raise SuiteError(f"cannot hold out {held_out} of {len(tasks)} tasks: ask for fewer, or a bigger suite")
    groups = _components(tasks)
    order = sorted(groups, key=lambda g: _rank(seed, g))
    quotas, taken, chosen = _quotas(tasks, held_out), Counter[str](), set()
    for g in order:  # kinds in proportion first
        need = Counter(t.kind for t in groups[g])
        if all(taken[k] + c <= quotas.get(k, 0) for k, c in need.items()):
            chosen.add(g)
            taken.update(need)
    for g in order:  # then whole groups until there are enough
        if sum(taken.values()) >= held_out:
            break
        if g not in chosen:
            chosen.add(g)
            taken.update(Counter(t.kind for t in groups[g]))
    train = [t for g in order if g not in chosen for t in groups[g]]
    held = [t for g in order if g in chosen for t in groups[g]]
    train.sort(key=lambda t: _rank(seed, t.task_id))
    held.sort(key=lambda t: _rank(seed, t.task_id))
    check_disjoint(train, held)
    return train, held


def check_disjoint(train: Iterable[Any], held_out: Iterable[Any]) -> None:
    """Raise SuiteError when a task id, a query (as a task key: case and trailing '?' ignored) or a
    near-duplicate group is on both sides."""
    train, held_out = list(train), list(held_out)
    for what, key in (
        ("task id", lambda t: t.task_id),
        ("query", lambda t: query_key(t.query)),
        ("near-duplicate group", group_of),
    ):
        both = {key(t) for t in train} & {key(t) for t in held_out}
        if both:
            raise SuiteError(
                f"{len(both)} {what}s are in both train and held-out (e.g. {sorted(both)[0]!r}): "
                "split the tasks with flowrl.demo.suite.split, which keeps each group on one side"
            )
