"""The review app: `create_app(store)` is a Starlette app serving the pages of `flowrl.review.routes`.

The security model (docs/review.md says it for users):

- **Traces are hostile.** Templates autoescape everything; no trace text is ever marked safe. Every response
  carries a Content-Security-Policy that allows scripts, styles, images and requests from this origin only,
  with no inline script or style, no plugins, no framing and no `<base>`; the page's one script is a file.
- **Every state-changing request needs the CSRF token**: a POST must be JSON and carry `X-CSRF-Token` equal to a
  secret made when the app is created and put in the page's `<meta name="csrf-token">`. A form on another site
  cannot set that header, and cannot read the page to learn the token.
- **Local by default.** Without a `token` the app answers only requests whose `Host` is this machine
  (127.0.0.1, localhost, ::1), which also stops DNS rebinding. With a `token` (a non-local `--host`), every
  request needs it: `?token=...` once sets an HttpOnly, SameSite=Strict cookie, and the app redirects to the
  same page without it in the address.
"""

from __future__ import annotations

import hmac
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from flowrl.data.grouping import GroupBy
from flowrl.localhost import LOCAL_HOSTS
from flowrl.review.queue import Reviewer

HERE = Path(__file__).parent
COOKIE = "flowrl_review_token"
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "font-src 'self'; object-src 'none'; media-src 'none'; frame-src 'none'; frame-ancestors 'none'; "
    "base-uri 'none'; form-action 'self'"
)
SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
}
SAFE_METHODS = ("GET", "HEAD")


def _hostname(host: str) -> str:
    """The name part of a `Host` header: `127.0.0.1:8000` → `127.0.0.1`, `[::1]:80` → `::1`."""
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class Guard:
    """ASGI middleware: the security headers, the local-host or token check, and the CSRF check (module doc)."""

    def __init__(self, app: ASGIApp, *, csrf: str, token: str | None) -> None:
        self.app, self.csrf, self.token = app, csrf, token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
            await send(message)

        refused = self.refuse(Request(scope))
        if refused is not None:
            await refused(scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)

    def refuse(self, request: Request) -> Response | None:
        """The response that turns `request` away, or None to let it through."""
        if self.token is None and _hostname(request.headers.get("host", "")) not in LOCAL_HOSTS:
            return PlainTextResponse("flowrl review answers only requests to 127.0.0.1 or localhost", 403)
        if self.token is not None:
            given = request.query_params.get("token")
            if given is not None and hmac.compare_digest(given.encode(), self.token.encode()):
                rest = urlencode([(k, v) for k, v in parse_qsl(request.url.query) if k != "token"])
                response = RedirectResponse(request.url.path + (f"?{rest}" if rest else ""), 303)
                response.set_cookie(COOKIE, self.token, httponly=True, samesite="strict", path="/")
                return response
            cookie = request.cookies.get(COOKIE, "")
            if not hmac.compare_digest(cookie.encode(), self.token.encode()):
                return PlainTextResponse(
                    "this review server needs its token: open the address `flowrl review` printed (with ?token=)", 401
                )
        if request.method not in SAFE_METHODS:
            sent = request.headers.get("x-csrf-token", "")
            if not hmac.compare_digest(sent.encode(), self.csrf.encode()):
                return JSONResponse({"error": "missing or wrong CSRF token: reload the page"}, 403)
            if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
                return JSONResponse({"error": "send JSON (Content-Type: application/json)"}, 415)
        return None


def create_app(
    store: Any, *, token: str | None = None, group_by: GroupBy = "query", min_labels: int = 20, fit: bool = True
) -> Starlette:
    """The review app over `store` (a `TraceStore` or `SegmentStore`). `token`: required of every request (for a
    non-local bind); without one, only requests to this machine's names are answered. `fit`: fit the learned
    reward on the store's manual labels now, so suggestions show from the first page."""
    import jinja2
    from starlette.templating import Jinja2Templates

    from flowrl.review import routes  # lazy: imports starlette

    reviewer = Reviewer(store, group_by=group_by, min_labels=min_labels)
    if fit:
        reviewer.refit()
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True)
    templates = Jinja2Templates(env=env)
    csrf = secrets.token_urlsafe(32)
    app = Starlette(routes=[*routes.routes(), Mount("/static", StaticFiles(directory=HERE / "static"), name="static")])
    app.state.reviewer = reviewer
    app.state.templates = templates
    app.state.csrf = csrf
    app.add_middleware(Guard, csrf=csrf, token=token)
    return app
