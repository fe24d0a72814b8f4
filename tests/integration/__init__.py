"""Integration tests against real third-party agents, each in its own venv (see toolbox_env.py)."""
