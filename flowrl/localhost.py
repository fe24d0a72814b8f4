"""The rule every flowrl server follows: listen on this machine only, unless the user says otherwise."""

from __future__ import annotations

from flowrl.errors import ConfigError

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def check_host(host: str, allow_remote: bool, command: str, risk: str) -> None:
    """ConfigError for a non-local `host` without `allow_remote`; `risk` says what anyone reaching it could do."""
    if host not in LOCAL_HOSTS and not allow_remote:
        raise ConfigError(
            f"--host {host}: {command} listens on 127.0.0.1; pass --allow-remote to listen on {host} ({risk})"
        )
