"""The page's files, shipped inside the package (no CDN), and the shared route table.

Owns: which files are served under which path, with which content type, and the framing of a
server-sent event. Must not: do any serving itself.
"""

from __future__ import annotations

from importlib import resources

#: Path (relative to where the dashboard is mounted) -> (file in ``static/``, content type).
ASSETS = {
    "": ("index.html", "text/html; charset=utf-8"),
    "static/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "static/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
    "static/timeline.js": ("timeline.js", "text/javascript; charset=utf-8"),
    "static/charts.js": ("charts.js", "text/javascript; charset=utf-8"),
    # uPlot (MIT, its licence next to it), the charting library, from its npm package.
    "static/vendor/uPlot.iife.min.js": (
        "vendor/uPlot.iife.min.js",
        "text/javascript; charset=utf-8",
    ),
    "static/vendor/uPlot.min.css": ("vendor/uPlot.min.css", "text/css; charset=utf-8"),
    "static/vendor/uPlot.LICENSE": ("vendor/uPlot.LICENSE", "text/plain; charset=utf-8"),
}
EVENTS = "events"
SNAPSHOT = "snapshot.json"
#: The timeline and the series the dashboard's process remembers (a page loads them once).
HISTORY = "history.json"
#: Seconds between keep-alive comments on an idle event stream.
KEEPALIVE = 15.0

_cache: dict[str, bytes] = {}


def asset(path: str) -> tuple[bytes, str] | None:
    """The body and content type served at ``path``, or None."""
    entry = ASSETS.get(path)
    if entry is None:
        return None
    name, content_type = entry
    body = _cache.get(name)
    if body is None:
        body = _cache[name] = (
            resources.files("kclasync.dashboard").joinpath("static", *name.split("/")).read_bytes()
        )
    return body, content_type


def sse_event(document: str) -> bytes:
    """One server-sent event carrying a JSON document (which never contains a newline)."""
    return f"event: snapshot\ndata: {document}\n\n".encode()


SSE_KEEPALIVE = b": keepalive\n\n"
SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}
