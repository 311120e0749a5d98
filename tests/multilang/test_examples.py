"""The docs' "same processor both ways" examples: the code in docs/multilang.md is the code in
examples/multilang/, and the in-process one processes and checkpoints every record of a stream
on moto (its ``save`` captured), then checkpoints again on a graceful stop without error."""

from __future__ import annotations

import importlib.util
import pathlib
import re
from types import ModuleType

import orjson
import pytest

from kclasync.testing.emulators import LocalAws
from tests.support import aws_for, wait_until

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "multilang"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_show_the_example_files() -> None:
    page = (ROOT / "docs" / "multilang.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert (EXAMPLES / "orders_processor.py").read_text() in blocks
    assert (EXAMPLES / "orders_consumer.py").read_text() in blocks
    props = (EXAMPLES / "app.properties").read_text()
    assert "executableName = python3 orders_processor.py" in props


@pytest.mark.asyncio
async def test_in_process_example_processes_and_checkpoints(
    moto: LocalAws, unique_name: str
) -> None:
    example = load("orders_consumer")
    saved: list[int] = []

    async def save(order: dict[str, int]) -> None:
        saved.append(order["id"])

    example.save = save
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(2)
        pending = [(f"k{i}", orjson.dumps({"id": i, "total": i * 10})) for i in range(50)]
        await aws.stream.put_records(unique_name, pending)
        consumer = aws.consumer(example.OrdersProcessor)
        async with consumer:
            await wait_until(lambda: sorted(saved) == list(range(50)), 30, "every order saved")
        scan = await aws.store.list_leases()
        assert all(lease.checkpoint.is_sequence for lease in scan.leases)
