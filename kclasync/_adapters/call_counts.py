"""Counting an adapter's calls by operation, for metrics, tests and benchmarks.

Owns: ``CallCounts``, the ``calls`` dict (operation -> calls made) every AWS adapter keeps and
its one ``_count`` method.
Must not: do I/O or know any service.
"""

from __future__ import annotations


class CallCounts:
    """Base of an adapter that counts its calls: ``calls[op]`` is how many ``op`` calls it made."""

    def __init__(self) -> None:
        #: Calls made, by operation.
        self.calls: dict[str, int] = {}

    def _count(self, op: str) -> None:
        self.calls[op] = self.calls.get(op, 0) + 1


__all__ = ["CallCounts"]
