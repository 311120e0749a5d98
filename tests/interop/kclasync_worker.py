"""A kclasync worker in its own process, for the interop suite: killed with SIGKILL like the Java
daemon, stopped gracefully with SIGTERM.

Usage: ``python kclasync_worker.py SPEC.json [--held]``; the spec names the emulator endpoints,
the stream, the application, the output file and the ``ConsumerConfig`` fields; with ``--held``
the worker starts only once a line arrives on stdin (the process is started ahead of its
handover, its imports done). Every record is appended to the output file as ``<shard>
<partition key> <counter> <sequence number> <epoch seconds>`` (the same line format as
``kcl_processor.py``) and each batch is checkpointed after it is written. Logs go to stderr at
INFO.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from kclasync import Consumer, ConsumerConfig
from kclasync._records import Record
from kclasync.testing.emulators import LocalAws


async def main(spec: dict[str, Any], out: TextIO) -> None:
    local = LocalAws(spec["endpoint"], spec.get("kinesis_endpoint"))

    async def handle(records: Sequence[Record]) -> None:
        now = time.time()
        lines = []
        for record in records:
            body = json.loads(record.data)
            lines.append(
                f"{record.shard_id} {body['k']} {body['c']} {record.sequence_number} {now:.3f}\n"
            )
        out.write("".join(lines))
        out.flush()

    consumer = Consumer(
        stream_name=spec["stream"],
        application_name=spec["application"],
        processor=handle,
        config=ConsumerConfig(**spec["config"]),
        client_options=local.client_options(),
    )
    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Task[None]] = []
    loop.add_signal_handler(
        signal.SIGTERM, lambda: stopping.append(loop.create_task(consumer.stop()))
    )
    await consumer.run()


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    with open(sys.argv[1], encoding="utf-8") as fh:
        spec = json.load(fh)
    if "--held" in sys.argv[2:]:
        sys.stdin.readline()
    with open(spec["out"], "a", encoding="utf-8") as out:
        asyncio.run(main(spec, out))
