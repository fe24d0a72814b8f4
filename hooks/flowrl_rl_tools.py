"""Drop-in: give a FlowAgent tools to train, export and switch to its own improved model.

Copy this file next to your application (or add hooks/ to sys.path) and call:

    from flowrl_rl_tools import register_rl_tools
    tools = register_rl_tools(agent)

The tools and their state live in `flowrl.rl_tools` (docs/export.md, "The agent's own tools").
"""

from flowrl.rl_tools import RUN_FILE, RLTools, default_runs_dir, flowrl_command, register_rl_tools

__all__ = ["RUN_FILE", "RLTools", "default_runs_dir", "flowrl_command", "register_rl_tools"]
