"""CodeExecutionReward: does the code the agent ran actually run?

It re-runs, in the sandbox (`flowrl.rewards.sandbox`), the code the agent executed: tool calls whose
name is exec-like (`exec_code`, `execute_code`, `python`, `run_python`, `shell`, `bash`, `run_shell`;
configurable) with the code under `code`, `source`, `command` or `script`, and, when asked
(`include_answer_blocks=True`, always for fresh GRPO completions), the fenced ```python / ```bash
blocks of the final answer. Each block runs on its own, in a fresh process, not as one session.

Value: the share of blocks that ran cleanly (exit 0 within the timeout): 1.0 when all did, 0.0 when
none did. None (cannot judge, never 0) when there is no code, or when the sandbox itself failed.
"""

from __future__ import annotations

import inspect
import json
import logging
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from flowrl.rewards.base import Reward, RewardResult
from flowrl.rewards.sandbox import LANGUAGES, ExecResult, Job, Sandbox
from flowrl.rewards.views import message_tool_calls
from flowrl.trace.schema import ExecutionTrace

log = logging.getLogger(__name__)

DEFAULT_TOOL_NAMES = ("exec_code", "execute_code", "python", "run_python", "shell", "bash", "run_shell")
DEFAULT_CODE_KEYS = ("code", "source", "command", "script")
SHELL_TOOL_NAMES = frozenset({"shell", "bash", "run_shell", "sh"})
_FENCE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.M | re.S)
_COMPLETION_MARK = "_flowrl_fresh_completion"


@dataclass(frozen=True)
class CodeBlock:
    """One piece of code to run, and where in the trace it came from."""

    language: str
    code: str
    origin: str


def fenced_blocks(text: str, origin: str = "final_response") -> list[CodeBlock]:
    """The ```python / ```bash (and py, python3, sh, shell) blocks of a text; untagged blocks are skipped."""
    blocks: list[CodeBlock] = []
    for match in _FENCE.finditer(text or ""):
        language = LANGUAGES.get(match.group(1).lower())
        code = match.group(2)
        if language and code.strip():
            blocks.append(CodeBlock(language, code, f"{origin}[{len(blocks)}]"))
    return blocks


class CodeExecutionReward(Reward):
    """Share of the agent's code blocks that run cleanly in the sandbox; None when there is no code.

    Options: `include_answer_blocks` also runs the fenced code of the final answer; `timeout` is the
    wall-clock limit per block (seconds); `tool_names` / `code_keys` say which tool calls carry code;
    `max_blocks` caps the blocks run per trace; `details_chars` caps the output kept in details.
    `sandbox` shares an existing `Sandbox`; otherwise one is started on first use with `workers`,
    `isolation`, `require_isolation` (e.g. "bwrap": refuse weaker isolation), `memory_mb` and any other
    `Sandbox` option in `sandbox_options`.
    """

    name = "code_execution"

    def __init__(  # noqa: PLR0913  # keyword-only: the reward's TOML options
        self,
        include_answer_blocks: bool = False,
        timeout: float = 5.0,
        *,
        tool_names: Iterable[str] = DEFAULT_TOOL_NAMES,
        code_keys: Iterable[str] = DEFAULT_CODE_KEYS,
        sandbox: Sandbox | None = None,
        max_blocks: int = 16,
        details_chars: int = 2000,
        workers: int | None = None,
        isolation: str = "auto",
        require_isolation: str | None = None,
        memory_mb: int | None = 1024,
        sandbox_options: dict[str, Any] | None = None,
    ) -> None:
        self.include_answer_blocks = include_answer_blocks
        self.timeout = timeout
        self.tool_names = frozenset(n.lower() for n in tool_names)
        self.code_keys = tuple(code_keys)
        self.max_blocks = max_blocks
        self.details_chars = details_chars
        self._sandbox = sandbox
        self._owns_sandbox = sandbox is None
        self._sandbox_options = {
            "workers": workers,
            "isolation": isolation,
            "require_isolation": require_isolation,
            "memory_mb": memory_mb,
            **(sandbox_options or {}),
        }
        known = set(inspect.signature(Sandbox).parameters) - {"timeout"}
        unknown = sorted(set(self._sandbox_options) - known)
        if unknown:
            raise TypeError(
                f"CodeExecutionReward: unknown sandbox option(s) {', '.join(unknown)} "
                f"(pass timeout= directly; sandbox options: {', '.join(sorted(known))})"
            )
        self._lock = threading.Lock()

    # -- the sandbox ----------------------------------------------------------------------------------
    @property
    def sandbox(self) -> Sandbox:
        with self._lock:
            if self._sandbox is None:
                self._sandbox = Sandbox(timeout=self.timeout, **self._sandbox_options)
            return self._sandbox

    def close(self) -> None:
        """Stop the sandbox this reward started (a sandbox passed in is left to its owner)."""
        with self._lock:
            if self._sandbox is not None and self._owns_sandbox:
                self._sandbox.close()
                self._sandbox = None

    def __enter__(self) -> CodeExecutionReward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what to run ----------------------------------------------------------------------------------
    def extract_blocks(self, trace: ExecutionTrace) -> list[CodeBlock]:
        """The code this trace ran: exec-like tool calls (from `tool_calls`, else from the assistant
        messages' `tool_calls`), then the answer's fenced blocks when asked."""
        blocks: list[CodeBlock] = []
        if trace.tool_calls:
            for i, call in enumerate(trace.tool_calls):
                block = self._tool_block(call.tool_name, call.arguments, f"tool_calls[{i}]")
                if block is not None:
                    blocks.append(block)
        else:
            for n, (fn, _) in enumerate(message_tool_calls(trace)):
                block = self._tool_block(str(fn.get("name") or ""), fn.get("arguments"), f"messages.tool_calls[{n}]")
                if block is not None:
                    blocks.append(block)
        if self.include_answer_blocks or trace.metadata.get(_COMPLETION_MARK):
            blocks.extend(fenced_blocks(trace.final_response))
        return blocks

    def _tool_block(self, name: str, arguments: Any, origin: str) -> CodeBlock | None:
        short = name.lower().rsplit(".", 1)[-1]
        if short not in self.tool_names:
            return None
        args = arguments
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                args = {"code": args}  # a bare string argument is the code itself
        if not isinstance(args, dict):
            return None
        key = next((k for k in self.code_keys if isinstance(args.get(k), str) and args[k].strip()), None)
        if key is None:
            return None
        declared = args.get("language") or args.get("lang")
        if isinstance(declared, str) and declared.strip():
            language = LANGUAGES.get(declared.strip().lower())
            if language is None:
                return None  # a language the sandbox does not run: not judged
        elif short in SHELL_TOOL_NAMES or key == "command":
            language = "bash"
        else:
            language = "python"
        return CodeBlock(language, args[key], f"{origin}:{name}")

    # -- scoring --------------------------------------------------------------------------------------
    def score(self, trace: ExecutionTrace) -> RewardResult:
        return self.score_batch([trace])[0]

    def score_batch(self, traces: Iterable[ExecutionTrace]) -> list[RewardResult]:
        """Score many traces, running all their blocks in parallel through the sandbox pool.
        Raises SandboxError when no allowed isolation works (see `require_isolation`)."""
        traces = list(traces)
        plans: list[tuple[list[CodeBlock], int]] = []
        jobs: list[Job] = []
        for trace in traces:
            blocks = self.extract_blocks(trace)
            run, skipped = blocks[: self.max_blocks], max(0, len(blocks) - self.max_blocks)
            plans.append((run, skipped))
            jobs.extend(Job(b.code, b.language, self.timeout) for b in run)
        results = self.sandbox.run_many(jobs) if jobs else []
        out: list[RewardResult] = []
        at = 0
        for blocks, skipped in plans:
            out.append(self._judge(blocks, results[at : at + len(blocks)], skipped))
            at += len(blocks)
        return out

    def _judge(self, blocks: list[CodeBlock], results: list[ExecResult], skipped: int) -> RewardResult:
        if not blocks:
            return RewardResult(None, {"reason": "no code to run", "blocks": []})
        details: dict[str, Any] = {
            "blocks": [self._block_details(b, r) for b, r in zip(blocks, results)],
            "isolation": results[0].isolation,
        }
        if skipped:
            details["skipped_blocks"] = skipped
        broken = [r for r in results if r.status == "infra_error"]
        if broken:
            details["reason"] = f"sandbox failure: {broken[0].error}"
            return RewardResult(None, details)
        passed = sum(r.ok for r in results)
        details.update(passed=passed, total=len(results))
        return RewardResult(passed / len(results), details)

    def _block_details(self, block: CodeBlock, result: ExecResult) -> dict[str, Any]:
        cap = self.details_chars
        info: dict[str, Any] = {
            "origin": block.origin,
            "language": block.language,
            "status": result.status,
            "exit_code": result.exit_code,
            "duration": result.duration,
            "stdout": result.stdout[:cap],  # the start of the output, the end of the errors
            "stderr": result.stderr[-cap:] if cap else "",
        }
        if result.reason:
            info["reason"] = result.reason
        if result.error:
            info["error"] = result.error
        if result.stdout_truncated or len(result.stdout) > cap:
            info["stdout_truncated"] = True
        if result.stderr_truncated or len(result.stderr) > cap:
            info["stderr_truncated"] = True
        return info

    # -- GRPO -----------------------------------------------------------------------------------------
    def trace_from_completion(self, prompt: Any, completion: Any, **columns: Any) -> ExecutionTrace:
        """A fresh completion is judged on its code blocks and on the code in its tool calls."""
        trace = super().trace_from_completion(prompt, completion, **columns)
        trace.metadata[_COMPLETION_MARK] = True
        return trace
