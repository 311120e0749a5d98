"""Records -> Arrow rows (``kclasync.spark.schema.records_to_arrow``): the batch built from
buffers holds exactly what ``pyarrow.array`` over the records' values gives (non-ASCII keys,
empty and binary data, missing, naive and non-UTC arrival times, sub-sequence numbers), and
building it does not import pandas (which ``pyarrow.array`` does on its first call)."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone

import pyarrow as pa

from kclasync._records import Record
from kclasync.spark.schema import ARROW_SCHEMA, records_to_arrow


def _oracle(records: list[Record], stream: str) -> pa.RecordBatch:
    arrivals = [
        r.approximate_arrival.astimezone(UTC) if r.approximate_arrival is not None else None
        for r in records
    ]
    return pa.RecordBatch.from_arrays(
        [
            pa.array([r.stream or stream for r in records], pa.string()),
            pa.array([r.shard_id for r in records], pa.string()),
            pa.array([r.sequence_number for r in records], pa.string()),
            pa.array([r.sub_sequence_number for r in records], pa.int64()),
            pa.array([r.partition_key for r in records], pa.string()),
            pa.array(arrivals, pa.timestamp("us", tz="UTC")),
            pa.array([r.data for r in records], pa.binary()),
        ],
        schema=ARROW_SCHEMA,
    )


def _records() -> list[Record]:
    base = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
    out = []
    for i in range(1000):
        arrival: datetime | None = base + timedelta(microseconds=7 * i)
        if i % 7 == 3:
            arrival = None
        elif i % 7 == 5:
            arrival = base.astimezone(timezone(timedelta(hours=-5, minutes=-30)))
        elif i % 7 == 6:
            arrival = datetime(2026, 3, 1, 12, 0, 0, i)  # naive: local time
        out.append(
            Record(
                data=bytes(range(i % 256))[: i % 50] + b"\x00\xff",
                partition_key=f"clé-{i % 13}-ключ",
                sequence_number=str(49_000_000_000_000_000_000_000_000 + i),
                shard_id=f"shardId-{i % 4:012d}",
                sub_sequence_number=i % 3,
                approximate_arrival=arrival,
                stream=None if i % 2 else "other-stream",
            )
        )
    return out


def test_the_rows_are_those_of_pyarrow_array() -> None:
    records = _records()
    batch = records_to_arrow(records, "the-stream")
    batch.validate(full=True)
    assert batch.schema == ARROW_SCHEMA
    assert batch.equals(_oracle(records, "the-stream"))
    assert batch.column("approximateArrivalTimestamp").null_count == len(
        [r for r in records if r.approximate_arrival is None]
    )
    # Slices (a task hands rows over in chunks) and an empty batch.
    assert records_to_arrow(records[3:10], "s").equals(_oracle(records[3:10], "s"))
    assert records_to_arrow([], "s").num_rows == 0


def test_building_rows_does_not_import_pandas() -> None:
    code = (
        "import sys\n"
        "from datetime import UTC, datetime\n"
        "from kclasync._records import Record\n"
        "from kclasync.spark.schema import records_to_arrow\n"
        "r = Record(b'x', 'k', '1', 'shardId-0', approximate_arrival=datetime.now(UTC))\n"
        "batch = records_to_arrow([r, r], 's')\n"
        "assert batch.num_rows == 2\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "False"
