"""Counting the retries botocore makes inside one call, and naming the error a retry was for.

botocore retries a throttled or failed request itself (``ClientOptions.max_attempts``) before
kclasync sees an error, so most network faults never reach the runtime's ``Retrier``. ``count``
registers two handlers on a client's own event hooks (each client has its own copy of its
session's hooks, so a session the user passed in is not changed): ``needs-retry`` notes the
error of the attempt that just failed in the request's context, and ``request-created`` reports
each attempt after the first, with that error, to ``on_retry(operation, code)``.

Owns: the two handlers (an attempt's error is named by ``kclasync.errors.error_code``).
Must not: decide whether to retry (botocore's retry mode does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kclasync.errors import error_code

_FAILED = "kclasync_failed_with"


def _response_code(response: Any, caught: BaseException | None) -> str:
    if caught is not None:
        return error_code(caught)
    try:
        http, parsed = response
        code = parsed.get("Error", {}).get("Code")
        return str(code) if code else f"HTTP {http.status_code}"
    except (TypeError, ValueError, AttributeError):
        return "unknown"


def count(client: Any, on_retry: Callable[[str, str], None]) -> None:
    """Report every retry botocore makes on ``client`` to ``on_retry(operation, code)``."""
    events = client.meta.events

    def failed(
        request_dict: Any = None,
        response: Any = None,
        caught_exception: BaseException | None = None,
        **_: Any,
    ) -> None:
        if request_dict is not None:
            request_dict["context"][_FAILED] = _response_code(response, caught_exception)

    def created(request: Any = None, operation_name: str = "", **_: Any) -> None:
        context = getattr(request, "context", None) or {}
        if context.get("retries", {}).get("attempt", 1) > 1:
            on_retry(operation_name, str(context.get(_FAILED, "unknown")))

    events.register("needs-retry", failed, unique_id="kclasync-count-failed")
    events.register("request-created", created, unique_id="kclasync-count-retry")
