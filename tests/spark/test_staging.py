"""``ParquetSink`` removes the scratch directories a worker that died mid-write left behind,
and keeps those a live worker is writing (no Spark needed)."""

from __future__ import annotations

import glob
import os
import pathlib
import time

from kclasync.spark import ParquetSink


def scratch(root: pathlib.Path, name: str, age: float) -> pathlib.Path:
    part = root / name / "_temporary" / "0" / "part-00000.parquet"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"PAR1")
    then = time.time() - age
    for path in [part, *part.parents]:
        if path == root:
            break
        os.utime(path, (then, then))
    return root / name


def test_stale_scratch_directories_are_removed_on_start(tmp_path: pathlib.Path) -> None:
    crashed_old_layout = scratch(tmp_path / "_staging", "a", age=3600)
    crashed = scratch(tmp_path / ".staging", "b", age=3600)
    live = scratch(tmp_path / ".staging", "c", age=5)
    sink = ParquetSink(str(tmp_path))
    assert sink.cleaned == 2
    assert not crashed_old_layout.exists() and not (tmp_path / "_staging").exists()
    assert not crashed.exists()
    assert live.exists()
    # Scratch files are hidden from a plain glob of the table.
    assert glob.glob(str(tmp_path / "**" / "*.parquet"), recursive=True) == []
