"""The MultiLangDaemon's properties file: reading it, decoding each value as the daemon does,
and the choices made from it (the child's command, the stream, the retrieval mode).

Owns: the file's syntax (``javaproperties``, the Java ``Properties`` format), one decoder per
kind of value with a one-line error naming the key, ``executableName`` split as the daemon
splits it (on runs of spaces), ``streamArn`` taking precedence over ``streamName``, and the
daemon's rule for ``retrievalMode = DEFAULT``.
Must not: build kclasync's configuration (``kclasync.multilang.settings``) or start anything.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime

import javaproperties

from kclasync.errors import KclAsyncError


class PropertiesError(KclAsyncError, ValueError):
    """The properties file cannot be used: one line naming the key (or the file)."""


#: ``MultiLangRecordProcessorFactory`` splits ``executableName`` on this (Java ``String.split``).
_COMMAND_DELIMITER = re.compile(" +")

#: The keys whose presence makes ``retrievalMode = DEFAULT`` poll (the daemon's polling bean).
POLLING_KEYS = frozenset(
    {
        "maxRecords",
        "idleTimeBetweenReadsInMillis",
        "retryGetRecordsInSeconds",
        "maxGetRecordsThreadPool",
        "millisBehindLatestThresholdForReducedTps",
    }
)

_TRUE = frozenset({"true", "yes", "y", "on", "1"})
_FALSE = frozenset({"false", "no", "n", "off", "0"})


def read_properties(path: str) -> dict[str, str]:
    """The file's keys and values (a key given twice: the last one, as in Java)."""
    try:
        with open(path, encoding="latin-1") as fh:
            return dict(javaproperties.load(fh))
    except FileNotFoundError:
        raise PropertiesError(f"properties file not found: {path}") from None
    except OSError as exc:
        raise PropertiesError(f"cannot read the properties file {path}: {exc.strerror}") from None


def split_command(executable: str) -> tuple[str, ...]:
    """``executableName`` as the daemon runs it: split on runs of spaces (not tabs, no quoting),
    trailing empty parts dropped as Java's ``split`` drops them."""
    parts = _COMMAND_DELIMITER.split(executable)
    while parts and parts[-1] == "":
        parts.pop()
    return tuple(parts)


class Values:
    """Typed access to the properties, each key read at most once (the rest are reported)."""

    def __init__(self, props: Mapping[str, str]) -> None:
        self._props = dict(props)
        self.used: set[str] = set()

    def __contains__(self, key: str) -> bool:
        return key in self._props

    def names(self) -> list[str]:
        return list(self._props)

    def text(self, key: str) -> str | None:
        if key not in self._props:
            return None
        self.used.add(key)
        value = self._props[key].strip()
        return value or None

    def required(self, key: str, why: str) -> str:
        value = self.text(key)
        if value is None:
            raise PropertiesError(f"{key}: {why}")
        return value

    def _bad(self, key: str, value: str, expected: str) -> PropertiesError:
        return PropertiesError(f"{key} = {value!r}: expected {expected}")

    def whole(self, key: str, *, minimum: int | None = None) -> int | None:
        value = self.text(key)
        if value is None:
            return None
        try:
            number = int(value)
        except ValueError:
            raise self._bad(key, value, "a whole number") from None
        if minimum is not None and number < minimum:
            raise self._bad(key, value, f"a whole number of at least {minimum}")
        return number

    def millis(self, key: str, *, positive: bool = True) -> float | None:
        """A duration in milliseconds, as seconds."""
        number = self.whole(key, minimum=1 if positive else 0)
        return None if number is None else number / 1000.0

    def number(self, key: str) -> float | None:
        value = self.text(key)
        if value is None:
            return None
        try:
            return float(value)
        except ValueError:
            raise self._bad(key, value, "a number") from None

    def flag(self, key: str) -> bool | None:
        value = self.text(key)
        if value is None:
            return None
        if value.lower() in _TRUE:
            return True
        if value.lower() in _FALSE:
            return False
        raise self._bad(key, value, "true or false")

    def choice(self, key: str, choices: tuple[str, ...]) -> str | None:
        value = self.text(key)
        if value is None:
            return None
        if value.upper() not in choices:
            raise self._bad(key, value, " or ".join(choices))
        return value.upper()

    def epoch_seconds(self, key: str) -> datetime | None:
        """``initialPositionInStreamExtended``: the daemon reads seconds since the epoch."""
        number = self.whole(key)
        return None if number is None else datetime.fromtimestamp(number, UTC)

    def endpoint(self, key: str) -> str | None:
        value = self.text(key)
        if value is not None and not re.match(r"^https?://[^\s/]+", value):
            raise self._bad(key, value, "a URL such as https://kinesis.us-east-1.amazonaws.com")
        return value


_ARN = re.compile(
    r"^arn:(?P<partition>[^:]+):kinesis:(?P<region>[^:]*):(?P<account>\d*)"
    r":stream/(?P<name>[^/]+)$"
)


def stream_from_arn(key: str, arn: str) -> tuple[str, str | None]:
    """The stream name and region of a stream ARN (the daemon takes the name from it)."""
    match = _ARN.match(arn)
    if match is None:
        raise PropertiesError(
            f"{key} = {arn!r}: expected arn:aws:kinesis:<region>:<account>:stream/<name>"
        )
    return match["name"], match["region"] or None


def retrieval_is_fanout(values: Values) -> bool:
    """``retrievalMode``: FANOUT, POLLING, or DEFAULT (the daemon's default): polling if any
    polling property is set, else enhanced fan-out."""
    mode = values.choice("retrievalMode", ("FANOUT", "POLLING", "DEFAULT")) or "DEFAULT"
    if mode == "DEFAULT":
        return not any(key in values for key in POLLING_KEYS)
    return mode == "FANOUT"
