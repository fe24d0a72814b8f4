"""docs/architecture.md must match the code: its layers, its size-rule exceptions and the names it gives."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "flowrl"
SIZE_RULES = frozenset({"C901", "PLR0913", "PLR0915"})
_NOQA = re.compile(r"#\s*noqa:\s*(?P<rules>[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*)(?:\s*#\s*(?P<reason>.*))?$")
_NAME = re.compile(r"`(flowrl(?:\.\w+)+)`")


def _doc() -> str:
    return DOC.read_text(encoding="utf-8")


def _contract(kind: str) -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    (found,) = [c for c in contracts if c["type"] == kind]
    return found


def _doc_layers() -> list[str]:
    blocks = re.findall(r"^```layers\n(.*?)^```$", _doc(), flags=re.MULTILINE | re.DOTALL)
    assert len(blocks) == 1, "docs/architecture.md needs exactly one ```layers block"
    return [line.strip() for line in blocks[0].splitlines() if line.strip()]


def _layer_members(layers: list[str]) -> set[str]:
    return {name.strip() for layer in layers for name in re.split(r"[|:]", layer)}


def _top_level() -> set[str]:
    """Every top-level module and package of flowrl (not `__init__`/`__main__`, not folders without `__init__.py`)."""
    names = {p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")}
    names |= {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    return {f"flowrl.{name}" for name in names}


def test_layers_match_the_import_linter_contract() -> None:
    assert _doc_layers() == _contract("layers")["layers"]


def test_every_top_level_module_is_in_a_layer() -> None:
    missing = _top_level() - _layer_members(_contract("layers")["layers"])
    assert not missing, f"add {sorted(missing)} to the layers contract in pyproject.toml and to docs/architecture.md"


def test_forbidden_contract_covers_every_module_but_demo() -> None:
    contract = _contract("forbidden")
    assert contract["forbidden_modules"] == ["flowrl.demo"]
    assert set(contract["source_modules"]) == _top_level() - {"flowrl.demo"}


def _size_exceptions_in_code() -> set[tuple[str, str, str, str]]:
    """(file, qualified function name, rules, reason) of every `# noqa` for a size rule on a `def` line."""
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        rel = path.relative_to(ROOT).as_posix()

        def visit(node: ast.AST, prefix: str, lines: list[str] = lines, rel: str = rel) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.ClassDef):
                    visit(child, f"{prefix}{child.name}.")
                elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    match = _NOQA.search(lines[child.lineno - 1])
                    rules = {r.strip() for r in match["rules"].split(",")} & SIZE_RULES if match else set()
                    if rules:
                        reason = (match["reason"] or "").strip() if match else ""
                        found.add((rel, prefix + child.name, ", ".join(sorted(rules)), reason))
                    visit(child, f"{prefix}{child.name}.")

        visit(ast.parse("\n".join(lines), filename=rel), "")
    return found


def _size_exceptions_in_doc() -> set[tuple[str, str, str, str]]:
    section = _doc().split("### Exceptions to the size rules", 1)[1].split("\n## ", 1)[0]
    rows = set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`flowrl/"):
            rows.add((cells[0].strip("`"), cells[1].strip("`"), cells[2], cells[3]))
    return rows


def test_size_rule_exceptions_are_listed() -> None:
    code, doc = _size_exceptions_in_code(), _size_exceptions_in_doc()
    rows = "\n".join(f"| `{f}` | `{fn}` | {rules} | {reason} |" for f, fn, rules, reason in sorted(code))
    assert doc == code, f"docs/architecture.md lists other exceptions than the code has; the code's:\n{rows}"


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if found:
            obj: Any = importlib.import_module(module)
            for attr in parts[cut:]:
                if not hasattr(obj, attr):
                    return False
                obj = getattr(obj, attr)
            return True
    return False


def test_every_name_the_doc_gives_exists() -> None:
    names = sorted(set(_NAME.findall(_doc())))
    assert names, "no `flowrl....` names found in docs/architecture.md"
    missing = [name for name in names if not _resolves(name)]
    assert not missing, f"docs/architecture.md names what the code does not have: {missing}"
