"""Errors a Spark user reads first: kclasync's own message, without asyncio's frames.

Spark reports an error raised in a Python data source with a header of its own and the Python
traceback; a deep traceback (the event loop, task groups, retries) pushes the one line that
says what is wrong far down. The source's entry points (``schema``, ``streamReader``, the
reader's ``initialOffset`` / ``latestOffset`` / ``partitions`` / ``commit``, each row batch of
``read``, the sink's checks) therefore re-raise kclasync's own errors (``KclAsyncError``:
options, a missing stream, lost data, ...) from their top with no traceback below it and
nothing chained, so Spark's text shows one short frame and then our line.

Owns: ``user_facing`` and ``user_facing_rows``. Must not: touch errors that are not kclasync's
(a bug must keep its whole traceback).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from kclasync.errors import KclAsyncError

__all__ = ["user_facing", "user_facing_rows"]

F = TypeVar("F", bound=Callable[..., Any])


def _bare(exc: KclAsyncError) -> KclAsyncError:
    exc.__traceback__ = None
    exc.__cause__ = None
    exc.__context__ = None
    exc.__suppress_context__ = True
    return exc


def user_facing(method: F) -> F:
    """``method`` raising kclasync's errors from its own frame, unchained."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except KclAsyncError as exc:
            failure = _bare(exc)
        raise failure

    return wrapper  # type: ignore[return-value]


def user_facing_rows(rows: Iterator[Any]) -> Iterator[Any]:
    """``rows``, with kclasync's errors raised from here, unchained."""
    while True:
        try:
            row = next(rows)
        except StopIteration:
            return
        except KclAsyncError as exc:
            failure = _bare(exc)
        else:
            yield row
            continue
        raise failure
