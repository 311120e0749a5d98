"""Processors that are not async are refused when the ``Consumer`` is built."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from kclasync import ConfigError, Consumer
from kclasync._processor import Checkpointer, ShardInfo
from kclasync._records import Record


def build(processor: object) -> Consumer:
    return Consumer(stream_name="s", application_name="app", processor=processor)


def test_a_plain_function_handler_is_refused_with_the_async_spelling() -> None:
    def handle(records: Sequence[Record]) -> None: ...

    with pytest.raises(ConfigError, match=r"async def handle\(records\)"):
        build(handle)


def test_a_plain_callable_object_with_a_records_argument_is_refused() -> None:
    class Handler:
        def __call__(self, records: Sequence[Record]) -> None: ...

    with pytest.raises(ConfigError, match="not a coroutine function"):
        build(Handler())


class SyncProcessor:
    def initialize(self, shard: ShardInfo) -> None: ...

    def process_records(
        self, records: Sequence[Record], checkpointer: Checkpointer, millis: int | None
    ) -> None: ...

    async def lease_lost(self) -> None: ...

    async def shard_ended(self, checkpointer: Checkpointer) -> None: ...

    async def shutdown_requested(self, checkpointer: Checkpointer) -> None: ...


def test_a_class_with_sync_methods_is_refused_naming_each_method() -> None:
    with pytest.raises(ConfigError) as caught:
        build(SyncProcessor)
    message = str(caught.value)
    assert "SyncProcessor" in message
    assert "async def initialize(self, shard)" in message
    assert "async def process_records(self, records, checkpointer, millis_behind_latest)" in (
        message
    )
    assert "lease_lost" not in message  # that one is async already


def test_a_class_missing_methods_is_refused() -> None:
    class Partial:
        async def process_records(
            self, records: Sequence[Record], checkpointer: Checkpointer, millis: int | None
        ) -> None: ...

    with pytest.raises(ConfigError, match="async def shard_ended"):
        build(Partial)


def test_async_handlers_classes_and_zero_argument_factories_are_accepted() -> None:
    async def handle(records: Sequence[Record]) -> None: ...

    class Good:
        async def initialize(self, shard: ShardInfo) -> None: ...

        async def process_records(
            self, records: Sequence[Record], checkpointer: Checkpointer, millis: int | None
        ) -> None: ...

        async def lease_lost(self) -> None: ...

        async def shard_ended(self, checkpointer: Checkpointer) -> None: ...

        async def shutdown_requested(self, checkpointer: Checkpointer) -> None: ...

    build(handle)
    build(Good)
    build(lambda: Good())


def test_a_handler_taking_two_arguments_is_refused_with_what_to_write() -> None:
    async def handle(records: Sequence[Record], extra: object) -> None: ...

    with pytest.raises(ConfigError) as caught:
        build(handle)
    message = str(caught.value)
    assert "got `async def handle(records, extra)`" in message
    assert "one argument, the batch" in message
    assert "write `async def handle(records): ...`" in message
    assert "process_records(self, records, checkpointer, millis_behind_latest)" in message


def test_handlers_callable_with_the_batch_alone_are_accepted() -> None:
    async def handle(records: Sequence[Record], extra: object = None) -> None: ...

    async def varargs(*batch: Sequence[Record]) -> None: ...

    class Bound:
        async def __call__(self, records: Sequence[Record]) -> None: ...

    for handler in (handle, varargs, Bound()):
        assert build(handler).worker_id
