"""The review app's pages and JSON endpoints. Handlers are plain functions: Starlette runs them in its thread pool,
so a store read or a label write never blocks the event loop.

Pages (GET): `/` the queue, `/t/{trace_id}` one run, `/group/{group_id}` a task's runs side by side.
Endpoints (POST, JSON, CSRF token checked by `flowrl.review.app.Guard`): `/api/label`, `/api/pick`, `/api/refit`.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from flowrl.errors import FlowRLError, StoreError
from flowrl.review.queue import LABELS, SORTS, QueueFilter, Reviewer
from flowrl.review.suggest import Agreement
from flowrl.review.view import trace_view
from flowrl.store.files import TRACE_ID
from flowrl.trace.schema import SOURCES

MAX_NOTES = 4000


def _reviewer(request: Request) -> Reviewer:
    return request.app.state.reviewer


def _page(request: Request, name: str, context: dict[str, Any], status: int = 200) -> Response:
    reviewer = _reviewer(request)
    base = {
        "csrf": request.app.state.csrf,
        "labelled_today": reviewer.labelled_today,
        "model_status": reviewer.suggester.status,
        "rate": Agreement.rate,
    }
    return request.app.state.templates.TemplateResponse(request, name, {**base, **context}, status_code=status)


def _error(request: Request, message: str, status: int) -> Response:
    return _page(request, "error.html", {"message": message, "q": ""}, status)


def _filters(request: Request) -> QueueFilter:
    return QueueFilter.from_params(dict(request.query_params))


def queue_page(request: Request) -> Response:
    reviewer = _reviewer(request)
    try:
        flt = _filters(request)
    except FlowRLError as exc:
        return _error(request, str(exc), 400)
    everything = list(reviewer.traces())
    rows = reviewer.rows(flt, everything)
    context = {
        "flt": flt,
        "q": flt.query(),
        "rows": rows[:500],
        "total": len(rows),
        "left": sum(not r.manual for r in rows),
        "agreement": reviewer.suggester.agreement(everything),
        "labels": LABELS,
        "sorts": SORTS,
        "sources": SOURCES,
        "first": rows[0].trace_id if rows else None,
    }
    return _page(request, "queue.html", context)


def trace_page(request: Request) -> Response:
    reviewer = _reviewer(request)
    trace_id = request.path_params["trace_id"]
    try:
        flt = _filters(request)
        trace = reviewer.get(trace_id)
    except StoreError as exc:
        return _error(request, str(exc), 404)
    except FlowRLError as exc:
        return _error(request, str(exc), 400)
    everything = list(reviewer.traces())
    row = reviewer.row(trace)
    context = {
        "q": flt.query(),
        "view": trace_view(trace),
        "row": row,
        "pos": (pos := reviewer.position(flt, trace_id, everything)),
        "left": pos.left,
        "group_size": sum(1 for t in everything if reviewer.grouper.key(t) == row.group_id),
        "agreement": reviewer.suggester.agreement(everything),
    }
    return _page(request, "trace.html", context)


def group_page(request: Request) -> Response:
    reviewer = _reviewer(request)
    group_id = request.path_params["group_id"]
    members = reviewer.group(group_id)
    if not members:
        return _error(request, f"no runs in group {group_id}: open a run and follow its group link", 404)
    try:
        flt = _filters(request)
    except FlowRLError as exc:
        return _error(request, str(exc), 400)
    columns = [(reviewer.row(t), trace_view(t)) for t in members]
    return _page(request, "group.html", {"group_id": group_id, "columns": columns, "q": flt.query()})


async def _body(request: Request) -> dict[str, Any]:
    try:
        data = await request.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _id(data: dict[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not TRACE_ID.match(value):
        raise ValueError(f"{key}: give a trace id")
    return value


async def label_api(request: Request) -> Response:
    from starlette.concurrency import run_in_threadpool

    data = await _body(request)
    verdict, notes = data.get("label"), data.get("notes", "")
    try:
        trace_id = _id(data, "trace_id")
        if verdict not in ("good", "bad"):
            raise ValueError("label: use good or bad")
        if not isinstance(notes, str) or len(notes) > MAX_NOTES:
            raise ValueError(f"notes: text of at most {MAX_NOTES} characters")
        trace = await run_in_threadpool(_reviewer(request).label, trace_id, verdict == "good", notes)
    except (ValueError, FlowRLError) as exc:
        return JSONResponse({"error": str(exc)}, 404 if isinstance(exc, StoreError) else 400)
    reviewer = _reviewer(request)
    return JSONResponse({"trace_id": trace.trace_id, "label": verdict, "labelled_today": reviewer.labelled_today})


async def pick_api(request: Request) -> Response:
    from starlette.concurrency import run_in_threadpool

    data = await _body(request)
    try:
        group_id = data.get("group_id")
        if not isinstance(group_id, str) or not group_id.isalnum():
            raise ValueError("group_id: give a group id")
        best, worst = _id(data, "best"), _id(data, "worst")
        await run_in_threadpool(_reviewer(request).pick, group_id, best, worst)
    except (ValueError, FlowRLError) as exc:
        return JSONResponse({"error": str(exc)}, 400)
    return JSONResponse({"group_id": group_id, "best": best, "worst": worst})


async def refit_api(request: Request) -> Response:
    from starlette.concurrency import run_in_threadpool

    status = await run_in_threadpool(_reviewer(request).refit)
    return JSONResponse({"status": status, "trained": _reviewer(request).suggester.reward.trained})


def routes() -> list[Route]:
    return [
        Route("/", queue_page, methods=["GET"]),
        Route("/t/{trace_id}", trace_page, methods=["GET"]),
        Route("/group/{group_id}", group_page, methods=["GET"]),
        Route("/api/label", label_api, methods=["POST"]),
        Route("/api/pick", pick_api, methods=["POST"]),
        Route("/api/refit", refit_api, methods=["POST"]),
    ]
