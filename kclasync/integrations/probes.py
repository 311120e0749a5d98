"""Liveness and readiness of consumers, for a web service's health endpoints.

Owns: what "live" and "ready" mean. Must not: import a web framework (each integration turns
the ``(status, body)`` pair into its own response). Safe to call from any thread, as a
framework's worker threads do (``Consumer.health`` needs no event loop).

- live: no consumer has stopped with an error. A service whose consumer died should be
  restarted (HTTP 503 tells the orchestrator so).
- ready: every consumer has started and is not stopping. A starting or draining instance is
  alive but should not be counted on (503), and is not restarted for it.
"""

from __future__ import annotations

from kclasync._consumer import Consumer


def _report(consumers: tuple[Consumer, ...]) -> dict[str, object]:
    return {"consumers": [consumer.health for consumer in consumers]}


def liveness(*consumers: Consumer) -> tuple[int, dict[str, object]]:
    """``(200, body)`` while no consumer has failed, else ``(503, body)``."""
    body = _report(consumers)
    failed = any(c.health["error"] is not None for c in consumers)
    return (503 if failed else 200), body


def readiness(*consumers: Consumer) -> tuple[int, dict[str, object]]:
    """``(200, body)`` once every consumer runs and none is stopping, else ``(503, body)``."""
    body = _report(consumers)
    ready = all(c.health["running"] for c in consumers)
    return (200 if ready else 503), body
