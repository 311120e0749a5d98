"""The record processor the Java MultiLangDaemon runs in the interop tests (one process per shard).

It speaks the MultiLang protocol through amazon_kclpy (shipped with kclpy-ext), appends one line
``<shard> <partition key> <counter> <sequence number> <epoch seconds>`` per record to the file
named by ``KCL_INTEROP_OUT`` and checkpoints after every batch, at shard end and when asked to
shut down. Each call other than ``process_records`` appends ``<shard> <call>`` to the same file
name plus ``.events``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from amazon_kclpy import kcl
from amazon_kclpy.v3 import processor


class RecordingProcessor(processor.RecordProcessorBase):  # type: ignore[misc]
    def __init__(self, out: str) -> None:
        self.out = out
        self.shard = "?"

    def _event(self, what: str) -> None:
        with open(self.out + ".events", "a", encoding="utf-8") as fh:
            fh.write(f"{self.shard} {what}\n")

    def initialize(self, initialize_input: Any) -> None:
        self.shard = initialize_input.shard_id
        self._event(f"initialize {initialize_input.sequence_number}")

    def process_records(self, process_records_input: Any) -> None:
        lines = []
        now = time.time()
        for record in process_records_input.records:
            body = json.loads(record.binary_data)
            seq = record.sequence_number
            lines.append(f"{self.shard} {body['k']} {body['c']} {seq} {now:.3f}\n")
        if lines:
            with open(self.out, "a", encoding="utf-8") as fh:
                fh.write("".join(lines))
                fh.flush()
        self._checkpoint(process_records_input.checkpointer)

    def _checkpoint(self, checkpointer: Any) -> None:
        try:
            checkpointer.checkpoint()
        except kcl.CheckpointError as exc:
            sys.stderr.write(f"checkpoint failed on {self.shard}: {exc}\n")

    def lease_lost(self, lease_lost_input: Any) -> None:
        self._event("leaseLost")

    def shard_ended(self, shard_ended_input: Any) -> None:
        self._event("shardEnded")
        self._checkpoint(shard_ended_input.checkpointer)

    def shutdown_requested(self, shutdown_requested_input: Any) -> None:
        self._event("shutdownRequested")
        self._checkpoint(shutdown_requested_input.checkpointer)


if __name__ == "__main__":
    kcl.KCLProcess(RecordingProcessor(os.environ["KCL_INTEROP_OUT"])).run()
