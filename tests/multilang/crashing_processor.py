"""``kcl_processor.py``'s processor (amazon_kclpy v3), except that it exits with status 3 when it
is given the record whose counter is ``KCL_POISON``: a child that dies mid-batch."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from amazon_kclpy import kcl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "interop"))
from kcl_processor import RecordingProcessor


class Crashing(RecordingProcessor):
    def process_records(self, process_records_input: Any) -> None:
        poison = int(os.environ["KCL_POISON"])
        for record in process_records_input.records:
            if json.loads(record.binary_data)["c"] == poison:
                os._exit(3)
        super().process_records(process_records_input)


if __name__ == "__main__":
    kcl.KCLProcess(Crashing(os.environ["KCL_INTEROP_OUT"])).run()
