"""flowrl's auto-hook entry point: on PYTHONPATH, it runs at interpreter start (see flowrl.autohook)."""

import os

if os.environ.get("FLOWRL_AUTOHOOK") == "1":
    try:
        from flowrl.autohook import install

        install()
    except Exception:  # never break the host's start-up
        import logging

        logging.getLogger("flowrl.autohook").warning("flowrl autohook: install failed", exc_info=True)
