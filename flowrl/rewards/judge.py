"""LLMJudgeReward: an LLM scores traces against a rubric, through any OpenAI-compatible endpoint.

Relative mode (the default) follows OpenPipe ART's RULER: all traces for the same task (same
`flowrl.trace.facts.task_key`: `group_key`, else the user turn as a task) go to the judge in ONE call. The messages
they share from the start are sent once in `<context>`, the offered tools in `<available_tools>`, and each
trace's remainder in its own `<trajectory id="N">`; the judge answers one 0-1 score per trajectory. Identical
traces are sent once and share the score. Absolute mode scores each trace on its own.

Reads `messages` (else a transcript rebuilt from `user_query`, `tool_calls` and `final_response`) and `tools`.
Value: the judge's score. When the judge cannot be asked or answers nothing usable after its retries (no
model configured, endpoint down, timeout, unparseable reply, no score for a trajectory), the result is an
error: value None with `error` set, never 0, and not "cannot judge" either, so `flowrl score` counts it
against its error budget instead of re-weighting the combined score without the judge.

Endpoint, model and key: arguments, else `FLOWRL_JUDGE_BASE_URL` / `FLOWRL_JUDGE_MODEL` /
`FLOWRL_JUDGE_API_KEY`, else `OPENAI_BASE_URL` / `OPENAI_API_KEY` (see docs/rewards.md for OpenAI,
Anthropic's compatible endpoint, OpenRouter, vLLM and Ollama).
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from flowrl.errors import ConfigError
from flowrl.rewards.base import Reward, RewardResult, note_crash
from flowrl.rewards.judge_client import JudgeClient, JudgeRequestError
from flowrl.trace.facts import task_key
from flowrl.trace.schema import ExecutionTrace

log = logging.getLogger(__name__)

DEFAULT_RUBRIC = """\
- A trajectory that achieves the user's goal always scores clearly higher than one that does not.
- Among trajectories that achieve the goal, the more efficient one scores higher: fewer needless steps,
  no failed or repeated tool calls, no wasted tokens.
- Trajectories of similar quality get similar scores; keep score gaps proportional to quality gaps.
- Give partial credit for real progress towards the goal.
- An honest report of a failure is better than a wrong or invented answer presented as a success."""

_RELATIVE_SYSTEM = """\
You grade AI agent trajectories. Every trajectory below was given the same task. Judge what the user wanted,
compare the trajectories with each other, and give each one a score between 0 and 1.

Grading rubric:
{rubric}

Reply with JSON only, in exactly this shape, with one entry per trajectory:
{{"scores": [{{"trajectory_id": "1", "explanation": "one or two sentences", "score": 0.0}}]}}"""

_ABSOLUTE_SYSTEM = """\
You grade one AI agent trajectory. Judge what the user wanted and how well the agent delivered it, and give
a score between 0 and 1.

Grading rubric:
{rubric}

Reply with JSON only, in exactly this shape:
{{"explanation": "one or two sentences", "score": 0.0}}"""


def trace_messages(trace: ExecutionTrace, max_chars: int) -> list[dict[str, Any]]:
    """The transcript to show the judge: `messages`, else one rebuilt from the toolboxv2 fields."""
    if trace.messages:
        msgs = [dict(m) for m in trace.messages if isinstance(m, dict)]
    else:
        msgs = [{"role": "user", "content": trace.user_query}]
        for tc in trace.tool_calls:
            msgs.append({"role": "assistant", "tool_calls": [{"name": tc.tool_name, "arguments": tc.arguments}]})
            msgs.append({"role": "tool", "name": tc.tool_name, "content": tc.result})
        if trace.final_response:
            msgs.append({"role": "assistant", "content": trace.final_response})
    for m in msgs:
        content = m.get("content")
        if isinstance(content, str) and len(content) > max_chars:
            m["content"] = content[:max_chars] + f"… [{len(content) - max_chars} more characters]"
    return msgs


def _dump(message: dict[str, Any]) -> str:
    return json.dumps(message, ensure_ascii=False, sort_keys=True, default=str)


def _with_client_options(init: Callable[..., None]) -> Callable[..., None]:
    """Let `init` take `JudgeClient`'s options through its `**client_options`, and say so in its signature: its
    own parameters, then the client's keywords (not `sleep`), which is what `help()` shows and what a reward
    config's keys are checked against (`flowrl.rewards.config`). The client declares them once."""
    own = [p for p in inspect.signature(init).parameters.values() if p.kind is not p.VAR_KEYWORD]
    taken = {p.name for p in own}
    client = [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
        for p in inspect.signature(JudgeClient).parameters.values()
        if p.name != "sleep" and p.name not in taken
    ]
    init.__signature__ = inspect.Signature(own + client)  # type: ignore[attr-defined]  # what inspect reads
    return init


class LLMJudgeReward(Reward):
    """`client_options` are `JudgeClient`'s keywords (endpoint, model, key, timeout, retries, cache, ...), declared
    there once; they are TOML keys under [rewards.judge] like the reward's own, and make the reward's client
    unless `client` is given."""

    name = "judge"

    @_with_client_options
    def __init__(
        self,
        mode: str = "relative",
        rubric: str = DEFAULT_RUBRIC,
        max_group_size: int = 12,
        max_chars_per_message: int = 4000,
        concurrency: int = 4,
        client: JudgeClient | None = None,
        **client_options: Any,
    ) -> None:
        if mode not in ("relative", "absolute"):
            raise ConfigError(f"judge mode {mode!r}: use relative or absolute")
        self.mode, self.rubric = mode, rubric.strip()
        self.max_group_size = max(1, max_group_size)
        self.max_chars = max_chars_per_message
        self.concurrency = max(1, concurrency)
        self.client = client or JudgeClient(**client_options)

    @property
    def stats(self) -> dict[str, int]:
        return self.client.stats

    # -- prompts ----------------------------------------------------------------------------------------
    def relative_prompt(
        self, transcripts: list[list[dict[str, Any]]], tools: list[dict[str, Any]]
    ) -> list[dict[str, str]]:
        dumped = [[_dump(m) for m in t] for t in transcripts]
        prefix = 0
        if len(dumped) > 1:
            shortest = min(len(d) for d in dumped)
            while prefix < shortest - 1 and all(d[prefix] == dumped[0][prefix] for d in dumped):
                prefix += 1
        parts = []
        if prefix:
            parts.append("<context>\n" + "\n".join(dumped[0][:prefix]) + "\n</context>")
        if tools:
            parts.append(
                "<available_tools>\n" + json.dumps(tools, ensure_ascii=False, default=str) + "\n</available_tools>"
            )
        parts.append("<trajectories>")
        for i, d in enumerate(dumped, 1):
            parts.append(f'<trajectory id="{i}">\n' + "\n".join(d[prefix:]) + "\n</trajectory>")
        parts.append("</trajectories>")
        return [
            {"role": "system", "content": _RELATIVE_SYSTEM.format(rubric=self.rubric)},
            {"role": "user", "content": "\n".join(parts)},
        ]

    def absolute_prompt(self, transcript: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, str]]:
        parts = []
        if tools:
            parts.append(
                "<available_tools>\n" + json.dumps(tools, ensure_ascii=False, default=str) + "\n</available_tools>"
            )
        parts.append("<trajectory>\n" + "\n".join(_dump(m) for m in transcript) + "\n</trajectory>")
        return [
            {"role": "system", "content": _ABSOLUTE_SYSTEM.format(rubric=self.rubric)},
            {"role": "user", "content": "\n".join(parts)},
        ]

    # -- scoring ----------------------------------------------------------------------------------------
    def _ask_relative(self, transcripts: list[list[dict[str, Any]]], tools: list[dict[str, Any]]) -> list[RewardResult]:
        n = len(transcripts)

        def parse(data: Any) -> list[list[Any]]:
            entries = data.get("scores") if isinstance(data, dict) else data
            by_id: dict[str, Any] = {}
            if isinstance(entries, dict):
                by_id = {str(k): v for k, v in entries.items()}
            elif isinstance(entries, list):
                for pos, e in enumerate(entries, 1):
                    if isinstance(e, dict):
                        by_id[str(e.get("trajectory_id", e.get("id", pos))).strip()] = e
                    else:
                        by_id[str(pos)] = e
            out = []
            for i in range(1, n + 1):
                e = by_id.get(str(i))
                score = e.get("score") if isinstance(e, dict) else e
                expl = e.get("explanation", "") if isinstance(e, dict) else ""
                out.append(
                    [
                        float(score) if isinstance(score, (int, float)) and not isinstance(score, bool) else None,
                        str(expl),
                    ]
                )
            if all(s is None for s, _ in out):
                raise ValueError("no trajectory got a numeric score")
            return out

        result, cached = self.client.complete_json(self.relative_prompt(transcripts, tools), parse)
        return [
            RewardResult(
                s,
                {"mode": "relative", "model": self.client.model, "explanation": e, "group_size": n, "cached": cached}
                if s is not None
                else {"mode": "relative"},
                error=None if s is not None else "the judge gave no score for it",
            )
            for s, e in result
        ]

    def _ask_absolute(self, transcript: list[dict[str, Any]], tools: list[dict[str, Any]]) -> RewardResult:
        def parse(data: Any) -> list[Any]:
            score = data.get("score") if isinstance(data, dict) else data
            if not isinstance(score, (int, float)) or isinstance(score, bool):
                raise ValueError("no numeric score")
            return [float(score), str(data.get("explanation", "")) if isinstance(data, dict) else ""]

        (score, expl), cached = self.client.complete_json(self.absolute_prompt(transcript, tools), parse)
        return RewardResult(
            score, {"mode": "absolute", "model": self.client.model, "explanation": expl, "cached": cached}
        )

    def _score_group(self, traces: list[ExecutionTrace]) -> list[RewardResult]:
        """One task's traces: identical ones are judged once; relative mode asks in chunks of max_group_size."""
        transcripts = [trace_messages(t, self.max_chars) for t in traces]
        keys = [json.dumps(m, sort_keys=True, default=str) for m in transcripts]
        first: dict[str, int] = {}
        for i, k in enumerate(keys):
            first.setdefault(k, i)
        order = list(first)
        tools = next((t.tools for t in traces if t.tools), [])
        scored: dict[str, RewardResult] = {}

        def absolute(k: str) -> None:
            try:
                scored[k] = self._ask_absolute(transcripts[first[k]], tools)
            except JudgeRequestError as exc:
                scored[k] = self._failed(exc, 1)

        if self.mode == "relative":
            for start in range(0, len(order), self.max_group_size):
                chunk = order[start : start + self.max_group_size]
                try:
                    scored.update(zip(chunk, self._ask_relative([transcripts[first[k]] for k in chunk], tools)))
                except JudgeRequestError as exc:
                    scored.update((k, self._failed(exc, len(chunk))) for k in chunk)
        elif len(order) == 1:
            absolute(order[0])
        else:
            with ThreadPoolExecutor(max_workers=min(self.concurrency, len(order))) as pool:
                list(pool.map(absolute, order))
        out = []
        for k in keys:
            r = scored[k]
            details = dict(r.details)
            if keys.count(k) > 1:
                details["identical_traces"] = keys.count(k)
            out.append(RewardResult(r.value, details, r.error))
        return out

    def _failed(self, exc: JudgeRequestError, n: int) -> RewardResult:
        log.warning("flowrl: the judge could not score %d trace(s): %s", n, exc)
        return RewardResult(None, {"mode": self.mode}, error=str(exc))

    def score_batch(self, traces: Iterable[ExecutionTrace]) -> list[RewardResult]:
        traces = list(traces)
        groups: dict[str, list[int]] = {}
        for i, t in enumerate(traces):
            groups.setdefault(task_key(t) if self.mode == "relative" else "", []).append(i)
        results: list[RewardResult | None] = [None] * len(traces)

        def run(indices: list[int]) -> None:
            try:
                rs = self._score_group([traces[i] for i in indices])
            except Exception as exc:  # never sink a scoring run: an error for each trace of the group
                message = note_crash(self, exc, f"a group of {len(indices)}", len(indices))
                rs = [RewardResult(None, error=message) for _ in indices]
            for i, r in zip(indices, rs):
                results[i] = r

        if len(groups) <= 1:
            for indices in groups.values():
                run(indices)
        else:
            with ThreadPoolExecutor(max_workers=min(self.concurrency, len(groups))) as pool:
                list(pool.map(run, groups.values()))
        return [r if r is not None else RewardResult(None, error="the judge did not score it") for r in results]

    def score(self, trace: ExecutionTrace) -> RewardResult:
        return self.score_batch([trace])[0]
