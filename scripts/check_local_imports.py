"""`make lint`: a function-local import of `flowrl.*` needs a comment saying why (on its line, its last line or
the line above). Import circles are import-linter's to catch (`[tool.importlinter]` in pyproject.toml); an
import hidden inside a function is left for a reason only: a module that must stay light (`import flowrl`,
the autohook), or one that imports a heavy third-party stack. Heavy third-party imports themselves stay lazy
and are not checked here.

    python scripts/check_local_imports.py flowrl
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def _first_party(node: ast.AST) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] == "flowrl"
    return isinstance(node, ast.Import) and any(a.name.split(".")[0] == "flowrl" for a in node.names)


def unexplained(path: Path) -> list[str]:
    """`path:line: statement` for each function-local flowrl import without a comment."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    found = []
    for fn in ast.walk(ast.parse(source, filename=str(path))):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if not _first_party(node):
                continue
            assert isinstance(node, (ast.Import, ast.ImportFrom))
            above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
            commented = "#" in lines[node.lineno - 1] or "#" in lines[(node.end_lineno or node.lineno) - 1]
            if not commented and not above.startswith("#"):
                found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    return sorted(set(found))


def main(roots: list[str]) -> int:
    found = [hit for root in roots for path in sorted(Path(root).rglob("*.py")) for hit in unexplained(path)]
    for hit in found:
        print(f"{hit}  <- import it at the top of the module, or say why it is local in a comment")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["flowrl"]))
