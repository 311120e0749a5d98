"""Log output for kclasync: plain text for people or one JSON object per line for machines.

    from kclasync.logging import configure_logging
    configure_logging(json=True)            # or the CLI's --log-format json

Every JSON line has the same keys, in the same order (``null`` when unknown): ``ts`` (UTC,
ISO 8601), ``level``, ``logger``, ``worker``, ``stream``, ``shard``, ``lease_key``,
``lease_counter``, ``event`` (a stable name for the kind of line: the ``event`` given with
``extra=`` or a slug of the message's format string), ``message``; then ``exception`` when one
is attached. Consumers bind ``worker`` for everything their tasks log and ``stream`` / ``shard``
/ ``lease_key`` for everything a shard's task logs, through a context variable, so lines from
several workers in one process stay apart.

Owns: the formatters, the logging context and ``configure_logging``. Must not: log anything
itself. Record payloads are never passed to a logger by kclasync; as a second line of defence
the formatters mask anything shaped like an AWS access key id or a request signature, and
``configure_logging`` keeps the AWS SDK's loggers (whose DEBUG output holds request bodies and
signed headers) at WARNING or above.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import logging
import re
import sys
import types
from collections.abc import Iterator, Mapping
from typing import TextIO

import orjson

__all__ = ["FIELDS", "JsonFormatter", "TextFormatter", "configure_logging", "log_context"]

#: The keys of every JSON log line, in order.
FIELDS = (
    "ts",
    "level",
    "logger",
    "worker",
    "stream",
    "shard",
    "lease_key",
    "lease_counter",
    "event",
    "message",
)
_CONTEXT_FIELDS = ("worker", "stream", "shard", "lease_key", "lease_counter")

_EMPTY: Mapping[str, object] = types.MappingProxyType({})
_context: contextvars.ContextVar[Mapping[str, object]] = contextvars.ContextVar(
    "kclasync_log_context", default=_EMPTY
)

# Loggers whose verbose output carries request bodies (record payloads) and signed headers.
_SDK_LOGGERS = ("botocore", "aiobotocore", "boto3", "urllib3", "s3transfer", "werkzeug", "moto")

_SECRETS = re.compile(
    r"\b(?:AKIA|ASIA|AIDA|AROA|AGPA|ANPA|ANVA|AIPA|APKA)[A-Z0-9]{12,}\b"  # access key ids
    r"|(?<=Credential=)[^,\s\"']+"  # SigV4 credential scope (holds the key id)
    r"|(?<=Signature=)[0-9a-fA-F]+"
    r"|(?i:(?<=aws_secret_access_key=)|(?<=aws_session_token=))[^,\s\"']+"
)


def redact(text: str) -> str:
    """``text`` with access key ids, SigV4 credentials and signatures masked."""
    return _SECRETS.sub("[redacted]", text)


def bind_log_context(**fields: object) -> contextvars.Token[Mapping[str, object]]:
    """Add ``fields`` to the logging context of the current task (and the tasks it starts)."""
    return _context.set({**_context.get(), **fields})


@contextlib.contextmanager
def log_context(**fields: object) -> Iterator[None]:
    """``fields`` in the logging context for the duration of the ``with`` block."""
    token = bind_log_context(**fields)
    try:
        yield
    finally:
        _context.reset(token)


_PLACEHOLDER = re.compile(r"%(?:\([^)]*\))?[-#0 +]*\d*(?:\.\d+)?[sdrfgixXeEc%]")
_NON_WORD = re.compile(r"[^a-z0-9]+")


def event_name(record: logging.LogRecord) -> str:
    """The record's ``event`` (from ``extra=``), or a slug of its format string: the same for
    every line of one kind, whatever the values."""
    given = getattr(record, "event", None)
    if isinstance(given, str) and given:
        return given
    template = _PLACEHOLDER.sub(" ", str(record.msg)).lower()
    return _NON_WORD.sub("_", template).strip("_")[:64] or "log"


def _fields(record: logging.LogRecord) -> dict[str, object]:
    context = _context.get()
    values: dict[str, object] = {
        "ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
            timespec="milliseconds"
        ),
        "level": record.levelname,
        "logger": record.name,
    }
    for name in _CONTEXT_FIELDS:
        value = getattr(record, name, None)
        values[name] = value if value is not None else context.get(name)
    values["event"] = event_name(record)
    values["message"] = redact(record.getMessage())
    return values


class JsonFormatter(logging.Formatter):
    """One JSON object per record with the keys in ``FIELDS`` (then ``exception``, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        values = _fields(record)
        if record.exc_info:
            values["exception"] = redact(self.formatException(record.exc_info))
        elif record.exc_text:
            values["exception"] = redact(record.exc_text)
        return orjson.dumps(values, default=str).decode()


class TextFormatter(logging.Formatter):
    """``time level logger [worker shard]: message``, with secrets masked."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s%(where)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        context = _context.get()
        where = [str(context[k]) for k in ("worker", "lease_key") if context.get(k) is not None]
        record.where = f" [{' '.join(where)}]" if where else ""
        return redact(super().format(record))


def configure_logging(
    *,
    json: bool = False,
    level: int | str = logging.INFO,
    stream: TextIO | None = None,
    sdk_level: int | str = logging.WARNING,
) -> logging.Handler:
    """Send every log record to ``stream`` (default: stderr) as text or, with ``json=True``, as
    one JSON object per line. Replaces the root logger's handlers; returns the new handler.

    ``sdk_level`` is the least level logged by the AWS SDK (botocore, aiobotocore, urllib3) and
    the emulators: their DEBUG lines hold request and response bodies, that is record payloads.
    """
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if json else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    floor = logging.getLevelName(sdk_level) if isinstance(sdk_level, str) else sdk_level
    for name in _SDK_LOGGERS:
        logging.getLogger(name).setLevel(max(floor, root.level))
    return handler
