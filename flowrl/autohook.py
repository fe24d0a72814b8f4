"""Instrument every FlowAgent created in a process, with no change to the host's code.

Works like `opentelemetry-instrument`: a `sitecustomize.py` on `PYTHONPATH` calls `install()` at
interpreter start when `FLOWRL_AUTOHOOK=1`. `install()` registers a post-import hook for each target
class; when its module is imported, the class's `__init__` is wrapped so that every new instance is
handed to `hook_into_agent` right after it is constructed. The host never sees a flowrl failure:
anything that goes wrong is logged and the agent runs unhooked.

Environment:
- `FLOWRL_AUTOHOOK=1` turns it on (anything else: off).
- `FLOWRL_AUTOHOOK_TARGETS`: comma-separated `module:Class` (default: toolboxv2's FlowAgent).
- `FLOWRL_STORE`: the trace store folder (default: `TraceStore.default()`).
- `FLOWRL_AUTOHOOK_RUN_METHODS`, `FLOWRL_AUTOHOOK_TOOL_METHODS`: comma-separated method names, for a
  class that is not a FlowAgent (passed to `hook_into_agent` as `run_methods` / `tool_methods`).
- `FLOWRL_AUTOHOOK_LLM_CALLS` (default `1`): once the program imports `openai` (LiteLLM imports it too), its
  LLM client calls made outside any hooked agent's run are recorded, one trace per conversation
  (`flowrl.capture_llm_calls`); `0` turns that off. The handle is `autohook.llm_calls`.

Start a program with it: `flowrl-instrument python app.py` (sets both variables for you), or
`PYTHONPATH=$(python -m flowrl.autohook --path):$PYTHONPATH FLOWRL_AUTOHOOK=1 python app.py`.
"""

from __future__ import annotations

import logging
import os
import sys
import weakref
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_TARGETS = "toolboxv2.mods.isaa.base.Agent.flow_agent:FlowAgent"
SITE_DIR = Path(__file__).parent / "_autohook_site"
_installed: set[str] = set()
# the Hook handles created, so a host can flush or unhook them; held weakly: a hook that was unhooked,
# or whose agent was garbage-collected, drops out once nothing else refers to it
hooks: weakref.WeakSet[Any] = weakref.WeakSet()
llm_calls: Any = None  # the `capture_llm_calls` handle, once the program imported openai


def enabled() -> bool:
    return os.environ.get("FLOWRL_AUTOHOOK") == "1"


def _targets() -> list[tuple[str, str]]:
    raw = os.environ.get("FLOWRL_AUTOHOOK_TARGETS") or DEFAULT_TARGETS
    out = []
    for item in raw.split(","):
        module, _, cls = item.strip().partition(":")
        if module and cls:
            out.append((module, cls))
        elif item.strip():
            log.warning("flowrl autohook: ignoring target %r (use module:Class)", item)
    return out


def _hook_instance(agent: Any) -> None:
    try:
        from flowrl.capture import hook_into_agent  # lazy: sitecustomize imports this module in every process

        store = os.environ.get("FLOWRL_STORE") or None
        options: dict[str, Any] = {}
        for env, key in (
            ("FLOWRL_AUTOHOOK_RUN_METHODS", "run_methods"),
            ("FLOWRL_AUTOHOOK_TOOL_METHODS", "tool_methods"),
        ):
            names = [n.strip() for n in os.environ.get(env, "").split(",") if n.strip()]
            if names:
                options[key] = names
        hooks.add(hook_into_agent(agent, store=store, **options))
    except Exception:
        log.warning("flowrl autohook: could not hook %s; it runs unhooked", type(agent).__name__, exc_info=True)


def _patch_class(module: Any, cls_name: str) -> None:
    import wrapt

    cls = getattr(module, cls_name, None)
    if cls is None:
        log.warning("flowrl autohook: %s has no class %s", module.__name__, cls_name)
        return

    def init_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = wrapped(*args, **kwargs)  # the host's own errors pass through untouched
        if type(instance) is cls or isinstance(instance, cls):
            _hook_instance(instance)
        return result

    wrapt.wrap_function_wrapper(cls, "__init__", init_wrapper)


def _capture_llm_calls(module: Any) -> None:
    """The program imported openai: record its client calls made outside hooked runs. Never raises."""
    global llm_calls
    if llm_calls is not None:
        return
    try:
        from flowrl.capture.grouping import capture_llm_calls  # lazy: as above, only when asked for

        llm_calls = capture_llm_calls(os.environ.get("FLOWRL_STORE") or None)
    except Exception:
        log.warning("flowrl autohook: could not record the LLM client calls; they run unrecorded", exc_info=True)


def install() -> list[str]:
    """Register the post-import hooks (idempotent). Returns the targets now watched."""
    import wrapt

    if os.environ.get("FLOWRL_AUTOHOOK_LLM_CALLS", "1") != "0" and "openai:llm_calls" not in _installed:
        _installed.add("openai:llm_calls")
        wrapt.register_post_import_hook(_capture_llm_calls, "openai")

    for module_name, cls_name in _targets():
        key = f"{module_name}:{cls_name}"
        if key in _installed:
            continue
        _installed.add(key)

        def on_import(module: Any, cls_name: str = cls_name) -> None:
            try:
                _patch_class(module, cls_name)
            except Exception:
                log.warning("flowrl autohook: could not patch %s.%s", module.__name__, cls_name, exc_info=True)

        wrapt.register_post_import_hook(on_import, module_name)
    return sorted(_installed)


def main(argv: list[str] | None = None) -> int:
    """`flowrl-instrument CMD...`: run CMD with the auto-hook on (or `--path` to print the site dir)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--path"]:
        print(SITE_DIR)
        return 0
    if not args or args[0] in ("-h", "--help"):
        print("usage: flowrl-instrument COMMAND [ARGS...]   (sets FLOWRL_AUTOHOOK=1 and PYTHONPATH)")
        return 0 if args else 2
    env = dict(os.environ)
    env["FLOWRL_AUTOHOOK"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE_DIR), env.get("PYTHONPATH", "")) if p)
    try:
        os.execvpe(args[0], args, env)
    except FileNotFoundError:
        print(f"flowrl-instrument: error: command not found: {args[0]}", file=sys.stderr)
        return 127


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
