"""The dashboard's HTTP app: the page (static files of this package) and a read-only JSON API
over the runs found (runs.py). Every route is a GET but the login form's; an unknown run, step
or file is a 404, a malformed parameter a 400 naming it.

- `GET /api/runs`: every run, newest first (runs.RunFolder.info).
- `GET /api/runs/{run}`: its info, resolved config, summary, error and events.
- `GET /api/runs/{run}/metrics?after=N&last=T`: the metrics lines after the first N, when the
  N-th still has `time` T; else all of them with `reset: true` (the run was resumed at an
  earlier checkpoint, or started over). The page polls it.
- `GET /api/runs/{run}/traces`: the steps with a trace file; `.../traces/{phase}/{step}`: its groups.

A run is a run folder, or a run seen through its orchestrator's status service (remote.py).
"""

from __future__ import annotations

import os
from importlib import resources
from typing import Any

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from rlrun.dashboard.registry import SERVICE
from rlrun.dashboard.runs import PHASES, Run, RunSources
from rlrun.dashboard.security import Access

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


def static_files() -> dict[str, tuple[bytes, str]]:
    """name -> (content, type) of the page's files, read once from the package: a request names
    a key of this table, never a path."""
    folder = resources.files("rlrun.dashboard") / "static"
    out = {}
    for entry in folder.iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if entry.is_file() and suffix in CONTENT_TYPES:
            out[entry.name] = (entry.read_bytes(), CONTENT_TYPES[suffix])
    return out


def create_app(sources: RunSources, *, loopback: bool = True, api_key: str | None = None) -> Access:
    app = FastAPI(title="rlrun dashboard", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"][1:]) or "request"
        return JSONResponse({"error": f"{where}: {first['msg']}", "field": where}, status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def not_found(request: Request, error: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": error.detail}, status_code=error.status_code)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"service": SERVICE, "pid": os.getpid()}

    _page_routes(app, static_files())
    _api_routes(app, sources)
    return Access(app, loopback=loopback, api_key=api_key)


def _page_routes(app: FastAPI, files: dict[str, tuple[bytes, str]]) -> None:
    def page(name: str) -> Response:
        if name not in files:
            raise HTTPException(404, f"no file {name!r}")
        content, kind = files[name]
        return Response(content, media_type=kind)

    @app.get("/")
    def index() -> Response:
        return page("index.html")

    @app.get("/login")
    def login() -> Response:
        return page("login.html")

    @app.get("/static/{name}")
    def static(name: str) -> Response:
        return page(name)


def _api_routes(app: FastAPI, sources: RunSources) -> None:
    def run(rid: str) -> Run:
        found = sources.get(rid)
        if found is None:
            raise HTTPException(404, f"no run {rid!r}")
        return found

    @app.get("/api/runs")
    def runs() -> dict[str, Any]:
        infos = [r.info() for r in sources.runs().values()]
        return {"runs": sorted(infos, key=lambda i: i["updated"], reverse=True)}

    @app.get("/api/runs/{rid}")
    def run_detail(rid: str) -> dict[str, Any]:
        found = run(rid)
        return {
            "info": found.info(),
            "config": found.config(),
            "summary": found.summary(),
            "error": found.error(),
            "events": found.events(),
        }

    @app.get("/api/runs/{rid}/metrics")
    def metrics(rid: str, after: int = Query(0, ge=0), last: float | None = None) -> dict[str, Any]:
        rows = run(rid).metrics()
        keeps = 0 < after <= len(rows) and rows[after - 1].get("time") == last
        return {
            "reset": not keeps and after > 0,
            "rows": rows[after:] if keeps or after == 0 else rows,
            "count": len(rows),
        }

    @app.get("/api/runs/{rid}/traces")
    def trace_steps(rid: str) -> dict[str, Any]:
        return {"steps": run(rid).trace_steps()}

    @app.get("/api/runs/{rid}/traces/{phase}/{step}")
    def trace_groups(rid: str, phase: str, step: int) -> dict[str, Any]:
        if phase not in PHASES:
            raise HTTPException(404, f"no phase {phase!r} (one of {', '.join(PHASES)})")
        groups = run(rid).trace_groups(phase, step)
        if groups is None:
            raise HTTPException(404, f"run {rid!r} has no traces of {phase} step {step}")
        return {"groups": groups}
