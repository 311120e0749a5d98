"""The source's checks at ``load()``, in the driver's own process, with or without a schema.

Spark asks a Python data source for nothing at ``load()`` when the query gives a schema
(``.schema(SCHEMA_DDL)``): the source is first called about a second after ``start()``, in a
process of Spark's, so a bad option failed late and ``LATEST`` meant "when the first offset
was planned" (records put between ``load()`` and that moment were never read). And when Spark
does call the source at ``load()``, its error text puts Spark's header and a traceback before
ours.

So ``kclasync.spark.register(spark)`` also wraps ``DataStreamReader`` (classic and Spark
Connect) in the process that builds the query: when the format is ``kinesis``, ``load()``
parses the options, checks the stream and the progress table (``kclasync.spark.checks``) and
raises kclasync's own error (``ConfigError``, ``StreamNotFoundError``) right there, unchained;
and it pins ``LATEST`` to that moment through the internal option ``kclasync.latestAt``. The
source trusts an earlier check (``kclasync.checked``) instead of repeating it in ``schema()``.

Owns: the wrapping (``install``, idempotent) and what ``load()`` adds. Must not: change a reader
whose format is not ``kinesis``, or keep state beyond the reader it was given.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

from kclasync._core.leases.position import InitialPositionKind
from kclasync.errors import KclAsyncError

__all__ = ["CHECKED", "LATEST_AT", "install", "source_load_checks"]

log = logging.getLogger("kclasync.spark")

#: Internal options the wrapped ``load()`` adds: when LATEST stands for, and "already checked".
LATEST_AT: Final = "kclasync.latestAt"
CHECKED: Final = "kclasync.checked"
_STATE: Final = "_kclasync_load"
_FORMATS: Final = frozenset({"kinesis"})


def source_load_checks(options: dict[str, str]) -> dict[str, str]:
    """Parse and check a source's options as ``load()`` is called; the options to add."""
    from kclasync.spark.checks import check_source
    from kclasync.spark.options import SourceOptions

    parsed = SourceOptions.parse(options)
    for name, why in parsed.ignored:
        log.warning("kinesis source: option %s has no effect here (%s)", name, why)
    check_source(parsed)
    added = {CHECKED: "true"}
    lowered = {k.lower() for k in options}
    if parsed.starting_position.kind is InitialPositionKind.LATEST and (
        LATEST_AT.lower() not in lowered
    ):
        added[LATEST_AT] = datetime.now(UTC).isoformat()
    return added


def _state(reader: Any) -> dict[str, Any]:
    state: dict[str, Any] | None = reader.__dict__.get(_STATE)
    if state is None:
        state = reader.__dict__[_STATE] = {"format": None, "options": {}}
    return state


def _recording(method: Callable[..., Any], record: Callable[..., None]) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        record(_state(self), *args, **kwargs)
        return method(self, *args, **kwargs)

    wrapper.__kclasync_wrapped__ = True  # type: ignore[attr-defined]
    return wrapper


def _on_format(state: dict[str, Any], source: str) -> None:
    state["format"] = str(source)


def _on_option(state: dict[str, Any], key: str, value: Any) -> None:
    state["options"][str(key)] = value


def _on_options(state: dict[str, Any], **options: Any) -> None:
    state["options"].update({str(k): v for k, v in options.items()})


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _wrap_load(load: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(load)
    def wrapper(self: Any, path: Any = None, format: Any = None, *args: Any, **kw: Any) -> Any:
        state = _state(self)
        source = format if format is not None else state["format"]
        if source is not None and str(source).lower() in _FORMATS:
            options = {k: _text(v) for k, v in state["options"].items()}
            options.update({k: _text(v) for k, v in kw.items() if k != "schema"})
            try:
                added = source_load_checks(options)
            except KclAsyncError as exc:
                raise _fresh(exc) from None
            for key, value in added.items():
                self.option(key, value)
        return load(self, path, format, *args, **kw)

    wrapper.__kclasync_wrapped__ = True  # type: ignore[attr-defined]
    return wrapper


def _fresh(exc: KclAsyncError) -> KclAsyncError:
    """The same error without its traceback and context (the user's own frame stays)."""
    exc.__traceback__ = None
    exc.__context__ = None
    exc.__cause__ = None
    return exc


def _reader_classes() -> list[Any]:
    classes: list[Any] = []
    from pyspark.sql.streaming.readwriter import DataStreamReader

    classes.append(DataStreamReader)
    try:
        from pyspark.sql.connect.streaming.readwriter import DataStreamReader as ConnectReader
    except ImportError:  # Spark Connect's client extras (grpcio, ...) are not installed
        pass
    else:
        classes.append(ConnectReader)
    return classes


def install() -> None:
    """Wrap ``DataStreamReader.format/option/options/load`` (once per class)."""
    for cls in _reader_classes():
        if getattr(cls.load, "__kclasync_wrapped__", False):
            continue
        cls.format = _recording(cls.format, _on_format)
        cls.option = _recording(cls.option, _on_option)
        cls.options = _recording(cls.options, _on_options)
        cls.load = _wrap_load(cls.load)
