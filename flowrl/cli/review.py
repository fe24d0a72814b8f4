"""`flowrl review`: a local web page to read runs, compare a task's runs and label them from the keyboard."""

from __future__ import annotations

import errno
import secrets
import socket
from pathlib import Path
from typing import Any

import typer

from flowrl.cli.common import StoreOption, console, err_console, open_store
from flowrl.errors import ConfigError


def register(app: typer.Typer) -> None:
    app.command("review")(review)


def review(
    store: Path | None = StoreOption,
    host: str = typer.Option("127.0.0.1", help="Address to listen on; another than localhost asks for a token."),
    port: int = typer.Option(8765, help="Port (0 picks a free one)."),
    group_by: str = typer.Option("query", "--group-by", help="What makes runs one task: query or group_key."),
) -> None:
    """Review traces in the browser: a queue with filters, one run at a time, a task's runs side by side.

    Keys: g good, b bad, s skip, n/p next/previous, e notes, r refit the suggestions. Labels go through the same
    store function as `flowrl traces label`. Ctrl-C stops. See docs/review.md."""
    try:
        import jinja2  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn
    except ImportError:
        from flowrl.review import MISSING_EXTRA  # lazy: keeps `flowrl --help` fast

        err_console.print(MISSING_EXTRA, highlight=False, markup=False)
        raise typer.Exit(1) from None
    from flowrl.localhost import LOCAL_HOSTS  # lazy: keeps `flowrl --help` fast
    from flowrl.review.app import create_app  # lazy: keeps `flowrl --help` fast

    if group_by not in ("query", "group_key"):
        raise ConfigError(f"--group-by {group_by!r}: use query or group_key")
    token = None
    if host not in LOCAL_HOSTS:
        token = secrets.token_urlsafe(24)
        err_console.print(
            f"[yellow]warning[/yellow]: listening on {host}: anyone who reaches it with the token below can read "
            "every trace and label them; prefer 127.0.0.1 and an SSH tunnel",
            highlight=False,
        )
    st = open_store(store)
    app = create_app(st, token=token, group_by=group_by)  # type: ignore[arg-type]
    sock = _bind(host, port)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{sock.getsockname()[1]}/" + (f"?token={token}" if token else "")
    console.print(f"reviewing {st.root} at {url} ; Ctrl-C stops", highlight=False, soft_wrap=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        close = getattr(st, "close", None)
        if close is not None:
            close()
    reviewer: Any = app.state.reviewer
    console.print(f"stopped; {reviewer.labelled_today} labels given today in this session", highlight=False)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        # the address, not the port, when the host cannot be resolved or is not this machine's
        bad_host = isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL
        fix = "pick an address of this machine for --host (default 127.0.0.1)" if bad_host else "pick another --port"
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}: {fix}") from exc
    sock.listen(128)
    sock.set_inheritable(True)
    return sock
