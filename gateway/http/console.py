"""The web console's files, served beside the HTTP API on its listener (docs/console.md).

The console is a client of the API (gateway/http/api.py): plain HTML and ES modules that ask
``/api/...`` with the user's basic-auth credentials, so anything it shows is scriptable. Its
files ship in the package (``console_files/``, with uPlot, MIT, vendored from the npm registry)
and are read once at start: a request costs no disk read, and what it may fetch is that fixed
set, whatever the path.
"""

from __future__ import annotations

from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Final

from aiohttp import web

from sluicegate.gateway.http.errors import json_error
from sluicegate.gateway.http.stack import Handler

# Content types by suffix, for the files the console ships.
_TYPES: Final = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
    ".png": "image/png",
    ".LICENSE": "text/plain",
}
# Only the server's own scripts, styles and API; no frames (the console closes connections).
_HEADERS: Final = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


def _read(directory: Traversable, prefix: str) -> dict[str, tuple[bytes, str]]:
    found: dict[str, tuple[bytes, str]] = {}
    for entry in directory.iterdir():
        path = prefix + entry.name
        if entry.is_dir():
            found.update(_read(entry, path + "/"))
            continue
        suffix = next((s for s in _TYPES if entry.name.endswith(s)), None)
        if suffix is not None:
            found[path] = (entry.read_bytes(), _TYPES[suffix])
    return found


class Console:
    """``/`` and ``/console/FILE`` from the package; everything else to the API's handler."""

    def __init__(self, api: Handler) -> None:
        self._api = api
        self._files = _read(files("sluicegate.gateway.http") / "console_files", "/console/")

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """A console file, or the API's answer."""
        path = request.raw_path.partition("?")[0]
        if path == "/api" or path.startswith("/api/"):
            return await self._api(request)
        if path == "/":
            path = "/console/index.html"
        found = self._files.get(path)
        if found is None:
            return json_error(404, "Not Found")
        if request.method not in ("GET", "HEAD"):
            return json_error(405, f"method {request.method} not allowed here")
        body, content_type = found
        return web.Response(body=body, content_type=content_type, headers=_HEADERS)
