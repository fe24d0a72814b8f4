"""SyntaxValidationReward: is the code and JSON the model wrote well-formed?

Reads
- fenced code blocks in what the model wrote (assistant messages, final response): ```python via `ast`,
  ```bash / ```sh / ```shell via `bash -n` (parse only, nothing runs), ```json via `json.loads`;
- code handed to code tools (`exec_code(code=…)`, `python`, `sandbox_code`, …) and commands handed to shell
  tools (`vfs_shell`, `bash`, …);
- the JSON text of every tool call's arguments in the transcript (must be a JSON object).

Value: the share of those pieces that parse. None when there is nothing to check (plain prose, no tools).
Python is parsed with top-level `await` allowed and IPython `%magic` / `!shell` lines blanked, the way
FlowAgent's `exec_code` accepts them. Untagged blocks are not judged (prose and output look alike).
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
from typing import Any

from flowrl.rewards.base import Reward, RewardResult
from flowrl.rewards.views import code_blocks, message_tool_calls, tool_calls
from flowrl.trace.schema import ExecutionTrace

PYTHON_TAGS = frozenset({"python", "py", "python3", "ipython", "pycon"})
SHELL_TAGS = frozenset({"bash", "sh", "shell", "zsh", "console-bash"})
JSON_TAGS = frozenset({"json"})

DEFAULT_PYTHON_TOOLS = (
    "exec_code",
    "python",
    "run_python",
    "execute_python",
    "python_exec",
    "sandbox_code",
    "code_interpreter",
    "ipython",
    "run_code",
    "execute_code",
)
DEFAULT_SHELL_TOOLS = (
    "bash",
    "shell",
    "sh",
    "vfs_shell",
    "sandbox_shell",
    "run_shell",
    "terminal",
    "execute_command",
    "run_command",
)
_CODE_KEYS = ("code", "source", "script", "python")
_SHELL_KEYS = ("command", "cmd", "script", "shell")
_MAGIC = re.compile(r"^(\s*)[%!].*$", re.MULTILINE)
_MAX_ERRORS = 5


def check_python(code: str) -> str | None:
    """None when `code` parses as Python, else the first error."""
    cleaned = _MAGIC.sub(lambda m: m.group(1) + "pass", code)
    try:
        compile(cleaned, "<code>", "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
    except SyntaxError as exc:
        return f"line {exc.lineno}: {exc.msg}"
    except (ValueError, MemoryError, RecursionError) as exc:  # NUL bytes, absurd nesting
        return f"{type(exc).__name__}: {exc}"
    return None


def check_json(text: str) -> str | None:
    try:
        json.loads(text)
    except (ValueError, TypeError) as exc:
        return str(exc)
    return None


def check_json_object(text: str) -> str | None:
    """Tool-call arguments: empty (no arguments) or a JSON object."""
    if not text.strip():
        return None
    try:
        value = json.loads(text)
    except (ValueError, TypeError) as exc:
        return str(exc)
    return None if isinstance(value, dict) else "arguments are not a JSON object"


class SyntaxValidationReward(Reward):
    name = "syntax"

    def __init__(
        self,
        python_tools: list[str] | tuple[str, ...] = DEFAULT_PYTHON_TOOLS,
        shell_tools: list[str] | tuple[str, ...] = DEFAULT_SHELL_TOOLS,
        check_shell: bool = True,
        shell_timeout_s: float = 5.0,
    ) -> None:
        self.python_tools = frozenset(python_tools)
        self.shell_tools = frozenset(shell_tools)
        self.bash = shutil.which("bash") if check_shell else None
        self.shell_timeout_s = shell_timeout_s

    # -- what to check --------------------------------------------------------------------------------
    def pieces(self, trace: ExecutionTrace) -> list[tuple[str, str, str]]:
        """(kind, where, text) for everything this reward checks; kind is python, shell or json."""
        out: list[tuple[str, str, str]] = []
        texts = [
            m["content"]
            for m in trace.messages
            if isinstance(m, dict) and m.get("role") == "assistant" and isinstance(m.get("content"), str)
        ]
        if trace.final_response and trace.final_response not in texts:
            texts.append(trace.final_response)
        for text in texts:
            for tag, code in code_blocks(text):
                kind = (
                    "python"
                    if tag in PYTHON_TAGS
                    else "shell"
                    if tag in SHELL_TAGS
                    else "json"
                    if tag in JSON_TAGS
                    else None
                )
                if kind and code.strip():
                    out.append((kind, f"```{tag} block", code))
        for view in tool_calls(trace, include_control=True):
            out.extend(self._tool_pieces(view.name, view.arguments))
        for fn, _cid in message_tool_calls(trace):
            raw = fn.get("arguments")
            if isinstance(raw, str):
                out.append(("json_args", f"{fn.get('name')} arguments", raw))
        return out

    def _tool_pieces(self, name: str, args: Any) -> list[tuple[str, str, str]]:
        if not isinstance(args, dict):
            return []
        lang = str(args.get("language") or args.get("lang") or "").lower()
        out = []
        if name in self.python_tools and (not lang or lang in PYTHON_TAGS):
            for key in _CODE_KEYS:
                if isinstance(args.get(key), str) and args[key].strip():
                    out.append(("python", f"{name}.{key}", args[key]))
                    break
        elif name in self.shell_tools or (name in self.python_tools and lang in SHELL_TAGS):
            for key in _SHELL_KEYS + _CODE_KEYS:
                if isinstance(args.get(key), str) and args[key].strip():
                    out.append(("shell", f"{name}.{key}", args[key]))
                    break
        return out

    # -- checks ---------------------------------------------------------------------------------------
    def check_shell(self, script: str) -> str | None | bool:
        """None when bash parses it, the error otherwise, False when it cannot be checked here."""
        if not self.bash:
            return False
        try:
            proc = subprocess.run(
                [self.bash, "-n"],
                input=script,
                capture_output=True,
                text=True,
                timeout=self.shell_timeout_s,
                env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        if proc.returncode == 0:
            return None
        return (proc.stderr.strip().splitlines() or ["syntax error"])[-1].replace("bash: ", "")

    def score(self, trace: ExecutionTrace) -> RewardResult:
        counts: dict[str, dict[str, int]] = {}
        errors: list[str] = []
        unchecked = 0
        for kind, where, text in self.pieces(trace):
            if kind == "python":
                problem: str | None | bool = check_python(text)
            elif kind == "shell":
                problem = self.check_shell(text)
                if problem is False:
                    unchecked += 1
                    continue
            elif kind == "json_args":
                problem = check_json_object(text)
            else:
                problem = check_json(text)
            c = counts.setdefault(kind, {"checked": 0, "valid": 0})
            c["checked"] += 1
            if problem is None:
                c["valid"] += 1
            elif len(errors) < _MAX_ERRORS:
                errors.append(f"{where} ({kind}): {problem}")
        checked = sum(c["checked"] for c in counts.values())
        details: dict[str, Any] = {"counts": counts}
        if errors:
            details["errors"] = errors
        if unchecked:
            details["shell_unchecked"] = unchecked
        if not checked:
            details["reason"] = "no code, shell commands or tool-call JSON to check"
            return RewardResult(None, details)
        valid = sum(c["valid"] for c in counts.values())
        return RewardResult(valid / checked, details)
