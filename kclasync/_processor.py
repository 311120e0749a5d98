"""The record-processor contract (the KCL's ShardRecordProcessor, in asyncio) and the checkpointer.

A processor is either

* an object with async ``initialize / process_records / lease_lost / shard_ended /
  shutdown_requested`` methods, one instance per shard (pass its class, or any zero-argument
  factory, as ``Consumer(processor=...)``), or
* a single ``async def handle(records)``; kclasync checkpoints after every batch it returns from
  (or, with ``buffered_handler_checkpoints``, every ``checkpoint_interval`` seconds).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, runtime_checkable

import attrs

from kclasync._core.leases.position import Checkpoint
from kclasync._records import Record


@attrs.frozen
class ShardInfo:
    """What a processor is told about the shard it was given."""

    stream: str
    shard_id: str
    lease_key: str
    #: Where reading starts: the lease's checkpoint when the processor was initialized.
    starting_checkpoint: Checkpoint
    parent_shard_ids: frozenset[str] = frozenset()


class Checkpointer(Protocol):
    """Writes checkpoints for one shard, fenced by the lease counter."""

    @property
    def shard_id(self) -> str: ...

    @property
    def last_checkpoint(self) -> Checkpoint: ...

    @property
    def last_delivered(self) -> Checkpoint | None: ...

    async def checkpoint(
        self,
        sequence_number: str | None = None,
        sub_sequence_number: int = 0,
        *,
        persist: bool = True,
    ) -> None:
        """Checkpoint at the given record, or at the last record delivered when called bare.

        ``persist=False`` only records the position in memory: it is written within
        ``checkpoint_interval`` seconds, and always before SHARD_END, a release, a handoff or a
        stop (after ``shutdown_requested`` returns). A crash replays the records since the last
        write.

        Raises ``InvalidCheckpointError`` if the position is before the current checkpoint or
        beyond the last delivered record, ``LeaseLostError`` if this worker no longer holds
        the lease (another worker's checkpoints win), ``ThrottledError``/``TransientError`` if
        the table could not be reached after retries (safe to call again).
        """

    async def checkpoint_shard_end(self) -> None:
        """Inside ``shard_ended``: record that the whole shard is processed."""

    async def prepare_checkpoint(
        self, sequence_number: str | None = None, sub_sequence_number: int = 0
    ) -> None:
        """Write only the pending (two-phase) checkpoint; ``checkpoint()`` commits it."""


@runtime_checkable
class RecordProcessor(Protocol):
    async def initialize(self, shard: ShardInfo) -> None: ...

    async def process_records(
        self,
        records: Sequence[Record],
        checkpointer: Checkpointer,
        millis_behind_latest: int | None,
    ) -> None: ...

    async def lease_lost(self) -> None:
        """Another worker owns the shard now; checkpointing is no longer possible."""

    async def shard_ended(self, checkpointer: Checkpointer) -> None:
        """Every record of the shard was delivered; must call ``checkpoint_shard_end()``."""

    async def shutdown_requested(self, checkpointer: Checkpointer) -> None:
        """This worker is stopping and still holds the lease: checkpoint now for a clean handoff."""


Handler = Callable[[Sequence[Record]], Awaitable[None]]
ProcessorFactory = Callable[[], RecordProcessor]


class HandlerProcessor:
    """Adapts ``async def handle(records)``: checkpoints after every batch that returns."""

    def __init__(self, handle: Handler, *, buffered: bool = False) -> None:
        self._handle = handle
        self._persist = not buffered

    async def initialize(self, shard: ShardInfo) -> None:
        return None

    async def process_records(
        self,
        records: Sequence[Record],
        checkpointer: Checkpointer,
        millis_behind_latest: int | None,
    ) -> None:
        await self._handle(records)
        await checkpointer.checkpoint(persist=self._persist)

    async def lease_lost(self) -> None:
        return None

    async def shard_ended(self, checkpointer: Checkpointer) -> None:
        await checkpointer.checkpoint_shard_end()

    async def shutdown_requested(self, checkpointer: Checkpointer) -> None:
        if checkpointer.last_delivered is not None and (
            checkpointer.last_delivered != checkpointer.last_checkpoint
        ):
            await checkpointer.checkpoint()


#: The methods a record processor must define, each an ``async def``.
PROCESSOR_METHODS = (
    "initialize",
    "process_records",
    "lease_lost",
    "shard_ended",
    "shutdown_requested",
)

_SIGNATURES = {
    "initialize": "(self, shard)",
    "process_records": "(self, records, checkpointer, millis_behind_latest)",
    "lease_lost": "(self)",
    "shard_ended": "(self, checkpointer)",
    "shutdown_requested": "(self, checkpointer)",
}


def _not_async(cls: type) -> list[str]:
    """The processor methods ``cls`` lacks or defines without ``async``."""
    return [
        name
        for name in PROCESSOR_METHODS
        if not inspect.iscoroutinefunction(getattr(cls, name, None))
    ]


def _requires_arguments(func: object) -> bool:
    """Whether ``func`` cannot be called without arguments (so it is no factory)."""
    try:
        signature = inspect.signature(func)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return any(
        p.default is inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        for p in signature.parameters.values()
    )


def _check_handler_arity(handle: object) -> None:
    """A record handler is called with one argument, the batch; refuse one that cannot be."""
    try:
        signature = inspect.signature(handle)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return  # not introspectable (some builtins): trust it
    try:
        signature.bind(())
    except TypeError:
        name = getattr(handle, "__name__", type(handle).__name__)
        empty = inspect.Parameter.empty
        params = ", ".join(str(p.replace(annotation=empty)) for p in signature.parameters.values())
        raise TypeError(
            f"processor= got `async def {name}({params})`, but a record handler is called "
            f"with one argument, the batch; write `async def {name}(records): ...`, or a "
            "processor class with `async def process_records(self, records, checkpointer, "
            "millis_behind_latest)` to get the checkpointer and the lag too"
        ) from None


def processor_factory(processor: object, *, buffered: bool = False) -> ProcessorFactory:
    """Turn what the user passed as ``processor=`` into a per-shard factory.

    Raises ``TypeError`` (turned into ``ConfigError`` by ``Consumer``) for what can be seen to
    be wrong before running: a plain ``def handle(records)``, or a class whose processor
    methods are missing or not coroutines."""
    is_async_callable = (
        callable(processor)
        and not isinstance(processor, type)
        and inspect.iscoroutinefunction(processor.__call__)
    )
    if inspect.iscoroutinefunction(processor) or is_async_callable:
        _check_handler_arity(processor)
        handle: Handler = processor  # type: ignore[assignment]

        def make_handler() -> RecordProcessor:
            return HandlerProcessor(handle, buffered=buffered)

        return make_handler
    if isinstance(processor, type):
        missing = _not_async(processor)
        if missing:
            wanted = "; ".join(f"async def {name}{_SIGNATURES[name]}" for name in missing)
            raise TypeError(
                f"processor= class {processor.__qualname__} must define its record-processor "
                f"methods as coroutines; write: {wanted}"
            )
    if isinstance(processor, RecordProcessor) and not isinstance(processor, type):
        raise TypeError(
            "processor= got a processor instance; pass its class or a zero-argument factory, "
            "so that every shard gets its own instance"
        )
    if callable(processor) and not isinstance(processor, type) and _requires_arguments(processor):
        name = getattr(processor, "__name__", type(processor).__name__)
        raise TypeError(
            f"processor= got {name}(), which is not a coroutine function; a record handler "
            f"must be written `async def {name}(records): ...` (a zero-argument callable is "
            "taken for a factory of processors)"
        )
    if callable(processor):
        factory = processor

        def make() -> RecordProcessor:
            made = factory()
            if not isinstance(made, RecordProcessor) or _not_async(type(made)):
                raise TypeError(
                    f"processor factory returned {made!r}, which lacks the async methods "
                    "initialize/process_records/lease_lost/shard_ended/shutdown_requested"
                )
            return made

        return make
    raise TypeError(
        "processor= must be an `async def handle(records)` function, or a class/factory of "
        f"objects with the record-processor methods; got {processor!r}"
    )
