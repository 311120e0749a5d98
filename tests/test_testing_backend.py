"""The in-memory backend as a user meets it: the example test of docs/testing.md, run as it is
printed there, and what the backend seam accepts and refuses."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from types import ModuleType

import pytest
from prometheus_client import CollectorRegistry

from kclasync import AWSBackend, ClientOptions, ConfigError, Consumer, ConsumerConfig
from kclasync.testing import MemoryBackend

PAGE = Path(__file__).resolve().parent.parent / "docs" / "testing.md"


def _page_example() -> ModuleType:
    """The page's example test (its last ``python`` block), as a module."""
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.DOTALL)
    module = ModuleType("testing_page_example")
    exec(compile(blocks[-1], str(PAGE), "exec"), module.__dict__)
    return module


async def test_the_documented_example_test_passes() -> None:
    example = _page_example()
    tests = [name for name in vars(example) if name.startswith("test_")]
    assert tests == ["test_totals_adds_up_every_record_and_checkpoints"]
    await getattr(example, tests[0])()


async def test_the_documented_example_fails_on_a_wrong_processor() -> None:
    """The example asserts something that can fail: a processor that drops a record fails it."""
    example = _page_example()

    class Dropping(example.Totals):  # type: ignore[name-defined,misc]
        async def handle(self, records: list[object]) -> None:
            await super().handle(records[1:])
            self.seen += 1  # claims to have seen the record it dropped
            if self.seen >= self.expected:
                self.all_seen.set()

    example.Totals = Dropping
    with pytest.raises(AssertionError):
        await example.test_totals_adds_up_every_record_and_checkpoints()


async def test_consumers_on_one_backend_share_the_shards() -> None:
    backend = MemoryBackend()
    backend.create_stream("s", shard_count=4)
    config = ConsumerConfig(
        initial_position="TRIM_HORIZON",
        failover_time=1.0,
        idle_time_between_reads=0.05,
        shutdown_timeout=2.0,
    )

    async def ignore(records: object) -> None:
        return None

    consumers = [
        Consumer(
            stream_name="s",
            application_name="app",
            processor=ignore,
            config=config,
            backend=backend,
            registry=CollectorRegistry(),
        )
        for _ in range(2)
    ]
    async with consumers[0], consumers[1]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while sorted(len(c.held_leases) for c in consumers) != [2, 2]:
            assert loop.time() < deadline, [c.held_leases for c in consumers]
            await asyncio.sleep(0.05)
        assert sum(c.is_leader for c in consumers) == 1  # one leader lock for the fleet
    assert sorted(backend.checkpoints()) == [f"shardId-00000000000{i}" for i in range(4)]


def test_aws_settings_go_to_the_aws_backend_not_beside_another() -> None:
    with pytest.raises(ConfigError, match="backend"):
        Consumer(
            stream_name="s",
            application_name="app",
            processor=lambda: None,
            backend=MemoryBackend(),
            region_name="eu-west-1",
        )
    with pytest.raises(ConfigError, match="backend: must be a Backend"):
        Consumer(stream_name="s", application_name="app", backend=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="either client_options"):
        AWSBackend(client_options=ClientOptions(), region_name="eu-west-1")
