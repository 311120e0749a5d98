"""The row schema shared by the Spark source and the Spark processor, and records -> Arrow.

Owns: the column names and types (Spark DDL and the matching Arrow schema), the conversion of
kclasync ``Record`` values to an Arrow record batch, and which layout a user schema names
(``with_schema_layout``).
Must not: import pyspark (pyarrow only), or do I/O.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from itertools import accumulate
from typing import Any

import attrs
import pyarrow as pa

from kclasync._records import Record
from kclasync.errors import ConfigError
from kclasync.spark.options import ColumnLayout, SourceOptions

__all__ = [
    "ARROW_SCHEMA",
    "COLUMNS",
    "LAYOUTS",
    "SCHEMA_DDL",
    "in_layout",
    "layout_ddl",
    "records_to_arrow",
]

COLUMNS = (
    "stream",
    "shardId",
    "sequenceNumber",
    "subSequenceNumber",
    "partitionKey",
    "approximateArrivalTimestamp",
    "data",
)

SCHEMA_DDL = (
    "stream STRING, shardId STRING, sequenceNumber STRING, subSequenceNumber BIGINT, "
    "partitionKey STRING, approximateArrivalTimestamp TIMESTAMP, data BINARY"
)

ARROW_SCHEMA = pa.schema(
    [
        pa.field("stream", pa.string()),
        pa.field("shardId", pa.string()),
        pa.field("sequenceNumber", pa.string()),
        pa.field("subSequenceNumber", pa.int64()),
        pa.field("partitionKey", pa.string()),
        pa.field("approximateArrivalTimestamp", pa.timestamp("us", tz="UTC")),
        pa.field("data", pa.binary()),
    ]
)


def records_to_arrow(records: Sequence[Record], stream: str) -> Any:
    """A ``pyarrow.RecordBatch`` with one row per record, in ``ARROW_SCHEMA``.

    Each column is built from its buffers (offsets and bytes, int64 values, a validity bitmap
    for missing arrival times), not with ``pyarrow.array`` over Python objects: that one
    imports pandas on its first call, seconds of a new Python worker's first batch. The price:
    about 0.4 us a row more than ``pyarrow.array`` once pandas is loaded.
    """
    n = len(records)
    arrivals = [r.approximate_arrival for r in records]
    try:
        micros = array("q", [(a - _EPOCH) // _MICROSECOND if a else 0 for a in arrivals])
    except TypeError:  # a naive time: local time, as ``astimezone`` reads it
        micros = array("q", [_micros(a) if a else 0 for a in arrivals])
    valid = _validity([a is not None for a in arrivals]) if None in arrivals else None
    subs = array("q", [r.sub_sequence_number for r in records])
    columns = [
        _text([(r.stream or stream).encode() for r in records]),
        _text([r.shard_id.encode() for r in records]),
        _text([r.sequence_number.encode() for r in records]),
        pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(subs)]),
        _text([r.partition_key.encode() for r in records]),
        pa.Array.from_buffers(_TIMESTAMP, n, [valid, pa.py_buffer(micros)]),
        _text([r.data for r in records], pa.binary()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


_TIMESTAMP = pa.timestamp("us", tz="UTC")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _micros(when: datetime) -> int:
    """Microseconds since the epoch, exactly (a naive time is local time, as ``astimezone``)."""
    aware = when if when.tzinfo is not None else when.astimezone(UTC)
    return (aware - _EPOCH) // _MICROSECOND


def _text(values: list[bytes], kind: Any = None) -> Any:
    """A string (or ``kind``) array of ``values``, none missing: 32-bit offsets and the bytes."""
    offsets = array("i", accumulate(map(len, values), initial=0))  # OverflowError past 2 GiB
    return pa.Array.from_buffers(
        kind or pa.string(),
        len(values),
        [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(values))],
    )


def _validity(present: list[bool]) -> Any:
    """An Arrow validity bitmap (bit i set: value i present), or None when all are."""
    if all(present):
        return None
    bits = bytearray((len(present) + 7) // 8)
    for i, here in enumerate(present):
        if here:
            bits[i >> 3] |= 1 << (i & 7)
    return pa.py_buffer(bytes(bits))


#: The columns each ``columnLayout`` emits, as (column, source column in ``ARROW_SCHEMA``):
#: ``awslabs`` is awslabs' spark-sql-kinesis-connector's layout, ``databricks`` the Databricks
#: ``kinesis`` source's. Types are the same as ours for every column they share.
LAYOUTS: dict[str, tuple[tuple[str, str], ...]] = {
    "kclasync": tuple((c, c) for c in COLUMNS),
    "awslabs": (
        ("data", "data"),
        ("streamName", "stream"),
        ("partitionKey", "partitionKey"),
        ("sequenceNumber", "sequenceNumber"),
        ("approximateArrivalTimestamp", "approximateArrivalTimestamp"),
    ),
    "databricks": (
        ("partitionKey", "partitionKey"),
        ("data", "data"),
        ("stream", "stream"),
        ("shardId", "shardId"),
        ("sequenceNumber", "sequenceNumber"),
        ("approximateArrivalTimestamp", "approximateArrivalTimestamp"),
    ),
}

_DDL_TYPES = dict(part.strip().split(" ", 1) for part in SCHEMA_DDL.split(","))


def layout_ddl(layout: str) -> str:
    """The Spark DDL of ``layout``'s columns."""
    return ", ".join(f"{name} {_DDL_TYPES[source]}" for name, source in LAYOUTS[layout])


def in_layout(batch: Any, layout: str) -> Any:
    """``batch`` (in ``ARROW_SCHEMA``) with ``layout``'s columns, in its order and names."""
    if layout == "kclasync":
        return batch
    columns = LAYOUTS[layout]
    return pa.RecordBatch.from_arrays(
        [batch.column(source) for _, source in columns], names=[name for name, _ in columns]
    )


def with_schema_layout(options: SourceOptions, schema: Any) -> SourceOptions:
    """``options`` with the column layout a user schema names (``.schema(...)``): the source
    emits the layout whose column names the schema has, in its order; a schema that is none of
    them is refused here, before any batch, instead of by Arrow in an executor."""
    names = tuple(schema.fieldNames()) if schema is not None else ()
    if not names:
        return options
    for layout in ColumnLayout:
        if names == tuple(name for name, _ in LAYOUTS[layout.value]):
            if layout is options.column_layout:
                return options
            return attrs.evolve(options, column_layout=layout)
    raise ConfigError(
        "schema",
        f"the columns {', '.join(names)} are not a layout of the kinesis source; use "
        f"kclasync.spark.SCHEMA_DDL or leave .schema(...) out (columnLayout picks awslabs' "
        "or Databricks' columns)",
    )
