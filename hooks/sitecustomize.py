"""Drop-in sitecustomize for host applications: put this folder on PYTHONPATH and set FLOWRL_AUTOHOOK=1."""

import os

if os.environ.get("FLOWRL_AUTOHOOK") == "1":
    try:
        from flowrl.autohook import install

        install()
    except Exception:  # never break the host's start-up
        import logging

        logging.getLogger("flowrl.autohook").warning("flowrl autohook: install failed", exc_info=True)
