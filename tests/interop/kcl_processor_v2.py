"""A version 2 record processor (amazon_kclpy's ``v2.processor``) for the multilang tests: the
same record lines as ``kcl_processor.py``; ``shutdown`` with its reason (TERMINATE checkpoints,
ZOMBIE does not) and ``shutdown_requested`` are appended to ``KCL_INTEROP_OUT`` + ``.events``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from amazon_kclpy import kcl
from amazon_kclpy.v2 import processor


class V2Processor(processor.RecordProcessorBase):  # type: ignore[misc]
    def __init__(self, out: str) -> None:
        self.out = out
        self.shard = "?"

    def _event(self, what: str) -> None:
        with open(self.out + ".events", "a", encoding="utf-8") as fh:
            fh.write(f"{self.shard} {what}\n")

    def _checkpoint(self, checkpointer: Any) -> None:
        try:
            checkpointer.checkpoint()
        except kcl.CheckpointError as exc:
            sys.stderr.write(f"checkpoint failed on {self.shard}: {exc}\n")

    def initialize(self, initialize_input: Any) -> None:
        self.shard = initialize_input.shard_id
        self._event(f"initialize {initialize_input.sequence_number}")

    def process_records(self, process_records_input: Any) -> None:
        now = time.time()
        lines = []
        for record in process_records_input.records:
            body = json.loads(record.binary_data)
            lines.append(
                f"{self.shard} {body['k']} {body['c']} {record.sequence_number} {now:.3f}\n"
            )
        with open(self.out, "a", encoding="utf-8") as fh:
            fh.write("".join(lines))
        self._checkpoint(process_records_input.checkpointer)

    def shutdown(self, shutdown_input: Any) -> None:
        self._event(f"shutdown {shutdown_input.reason}")
        if shutdown_input.reason == "TERMINATE":
            self._checkpoint(shutdown_input.checkpointer)

    def shutdown_requested(self, shutdown_requested_input: Any) -> None:
        self._event("shutdownRequested")
        self._checkpoint(shutdown_requested_input.checkpointer)


if __name__ == "__main__":
    kcl.KCLProcess(V2Processor(os.environ["KCL_INTEROP_OUT"])).run()
