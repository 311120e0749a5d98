"""A live web view of a kclasync (or Java KCL) application: leases, workers, leader, changes.

Standalone: ``kclasync dashboard -a APP``. Inside an aiohttp service::

    from kclasync.dashboard import dashboard_app
    app.add_subapp("/fleet/", dashboard_app("billing"))

Inside FastAPI or Starlette::

    from kclasync.dashboard import dashboard_asgi
    app.mount("/fleet", dashboard_asgi("billing"))

The page is served at the mount point (with its trailing slash) and updates itself over
server-sent events; the table is read once per ``interval`` while at least one page is open.
Everything it needs ships in this package. It reads the lease table, the worker registry and
the ``<table>-CoordinatorState`` leader item, and never writes.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web

from kclasync._adapters.aws import ClientOptions
from kclasync.dashboard._aiohttp import DASHBOARD_KEY, aiohttp_app
from kclasync.dashboard._asgi import DashboardAsgi
from kclasync.dashboard._hub import Dashboard

__all__ = ["DASHBOARD_KEY", "Dashboard", "DashboardAsgi", "dashboard_app", "dashboard_asgi"]


def dashboard_app(
    application: str,
    *,
    client_options: ClientOptions | None = None,
    table: str | None = None,
    metrics_urls: Sequence[str] = (),
    interval: float = 1.0,
) -> web.Application:
    """The dashboard of ``application`` as an aiohttp application.

    ``metrics_urls``: the workers' Prometheus endpoints; with them the page shows millis behind
    latest, records per second, renewal failures and processor errors per worker and lease.
    """
    return aiohttp_app(
        Dashboard(
            application,
            client_options=client_options,
            table=table,
            metrics_urls=metrics_urls,
            interval=interval,
        )
    )


def dashboard_asgi(
    application: str,
    *,
    client_options: ClientOptions | None = None,
    table: str | None = None,
    metrics_urls: Sequence[str] = (),
    interval: float = 1.0,
) -> DashboardAsgi:
    """The dashboard of ``application`` as an ASGI application (arguments as ``dashboard_app``).

    Mounted sub-applications get no lifespan events; polling stops by itself when the last
    page closes.
    """
    return DashboardAsgi(
        Dashboard(
            application,
            client_options=client_options,
            table=table,
            metrics_urls=metrics_urls,
            interval=interval,
        )
    )
