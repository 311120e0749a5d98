"""The MultiLang protocol's messages, as the Java KCL's MultiLangDaemon writes and reads them.

Owns: encoding the daemon's messages to the child (one JSON object per line, the daemon's field
names and order: ``action`` first, then the fields in the order the daemon's Jackson classes
declare them, ``null`` where the daemon writes null) and decoding the child's lines into a
``Status``, a ``CheckpointRequest``, or ``NotAMessage`` (a line the daemon skips).
Must not: do I/O, start processes, or know about shards, leases or asyncio.

Facts from the daemon (package ``software.amazon.kinesis.multilang`` of the Java KCL 3.x):

* to the child: ``initialize``, ``processRecords``, ``leaseLost``, ``shardEnded``,
  ``shutdownRequested`` and ``checkpoint`` (the answer to a checkpoint request). The legacy
  ``shutdown`` message (with a ``reason``) is only a type the daemon can decode; it never writes
  one. Version 1 and 2 processors get their ``shutdown(reason)`` from the client library, which
  turns ``leaseLost`` into ZOMBIE and ``shardEnded`` into TERMINATE.
* from the child: ``status`` (``responseFor`` names the action answered) and ``checkpoint``
  (``sequenceNumber`` and ``subSequenceNumber``, either may be null). A line that is empty, not
  JSON, or JSON that is not one of the daemon's messages is skipped (the daemon logs it).
* record fields: ``data`` (base64), ``partitionKey``, ``sequenceNumber``,
  ``approximateArrivalTimestamp`` (epoch milliseconds, or null), ``subSequenceNumber``, and
  ``action: "record"``.
* a refused checkpoint is answered with ``error`` set to the simple class name of the Java
  exception (``ERROR_*`` below).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import attrs
import orjson

from kclasync._records import Record

INITIALIZE = "initialize"
PROCESS_RECORDS = "processRecords"
LEASE_LOST = "leaseLost"
SHARD_ENDED = "shardEnded"
SHUTDOWN_REQUESTED = "shutdownRequested"
CHECKPOINT = "checkpoint"
STATUS = "status"

#: The error strings of a refused checkpoint (the Java exception's simple name).
#: A position outside (last checkpoint, last record delivered], or not a sequence number.
ERROR_INVALID = "IllegalArgumentException"
#: The lease is no longer held by this worker (the fenced write was refused).
ERROR_LEASE_LOST = "ShutdownException"
#: A checkpoint asked for where the daemon has no checkpointer (initialize, leaseLost).
ERROR_NO_CHECKPOINTER = "InvalidStateException"
#: The lease table throttled the write.
ERROR_THROTTLED = "ThrottlingException"
#: The lease table could not be reached.
ERROR_DEPENDENCY = "KinesisClientLibDependencyException"

#: The fields the daemon's own classes accept per action from the child (Jackson refuses any
#: other field, and the line is then skipped as not a message).
_CHILD_FIELDS = {
    STATUS: frozenset({"action", "responseFor"}),
    CHECKPOINT: frozenset({"action", "sequenceNumber", "subSequenceNumber", "error"}),
}
#: Messages the daemon decodes but ignores while waiting for a status.
_OTHER_ACTIONS = frozenset(
    {INITIALIZE, PROCESS_RECORDS, LEASE_LOST, SHARD_ENDED, SHUTDOWN_REQUESTED, "shutdown"}
)


def _line(message: dict[str, Any]) -> bytes:
    return orjson.dumps(message) + b"\n"


def encode_initialize(
    shard_id: str, sequence_number: str | None, sub_sequence: int | None
) -> bytes:
    return _line(
        {
            "action": INITIALIZE,
            "shardId": shard_id,
            "sequenceNumber": sequence_number,
            "subSequenceNumber": sub_sequence,
        }
    )


def record_fields(record: Record) -> dict[str, Any]:
    arrival = record.approximate_arrival
    return {
        "data": base64.b64encode(record.data).decode("ascii"),
        "partitionKey": record.partition_key,
        "sequenceNumber": record.sequence_number,
        "approximateArrivalTimestamp": None
        if arrival is None
        else round(arrival.timestamp() * 1000),
        "subSequenceNumber": record.sub_sequence_number,
        "action": "record",
    }


def encode_process_records(records: Sequence[Record], millis_behind_latest: int | None) -> bytes:
    return _line(
        {
            "action": PROCESS_RECORDS,
            "records": [record_fields(r) for r in records],
            "millisBehindLatest": millis_behind_latest,
        }
    )


def encode_lease_lost() -> bytes:
    return _line({"action": LEASE_LOST})


def encode_shard_ended() -> bytes:
    return _line({"action": SHARD_ENDED})


def encode_shutdown_requested() -> bytes:
    return _line({"action": SHUTDOWN_REQUESTED})


def encode_checkpoint_reply(
    sequence_number: str | None, sub_sequence: int | None, error: str | None
) -> bytes:
    return _line(
        {
            "action": CHECKPOINT,
            "sequenceNumber": sequence_number,
            "subSequenceNumber": sub_sequence,
            "error": error,
        }
    )


@attrs.frozen
class Status:
    """The child finished the action named ``response_for``."""

    response_for: str | None


@attrs.frozen
class CheckpointRequest:
    """The child asks for a checkpoint; a None sequence number means the last record delivered.
    ``valid`` is False when the values are not a sequence number and a whole number (the
    request is then refused with ``IllegalArgumentException``)."""

    sequence_number: str | None
    sub_sequence: int | None
    valid: bool = True


@attrs.frozen
class Ignored:
    """One of the daemon's messages that is neither a status nor a checkpoint (ignored)."""

    action: str


@attrs.frozen
class NotAMessage:
    """A line the daemon skips: not JSON, or not one of its messages."""

    line: str


ChildMessage = Status | CheckpointRequest | Ignored | NotAMessage


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise TypeError


def _whole(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    raise TypeError


def decode_child_line(raw: bytes) -> ChildMessage | None:
    """One line from the child's stdout; None for an empty line (skipped silently)."""
    text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
    if text == "":
        return None
    try:
        message = orjson.loads(text)
    except orjson.JSONDecodeError:
        return NotAMessage(text)
    if not isinstance(message, dict):
        return NotAMessage(text)
    action = message.get("action")
    if action in _OTHER_ACTIONS:
        return Ignored(str(action))
    fields = _CHILD_FIELDS.get(action) if isinstance(action, str) else None
    if fields is None or not set(message) <= fields:
        return NotAMessage(text)
    if action == STATUS:
        response_for = message.get("responseFor")
        if response_for is not None and not isinstance(response_for, str):
            return NotAMessage(text)
        return Status(response_for)
    try:
        sequence = _text(message.get("sequenceNumber"))
        sub = _whole(message.get("subSequenceNumber"))
    except TypeError:
        return NotAMessage(text)
    valid = (sequence is None or (sequence.isascii() and sequence.isdigit())) and (
        sub is None or sub >= 0
    )
    return CheckpointRequest(sequence, sub, valid)
