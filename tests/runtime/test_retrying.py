"""The retry wrappers: every adapter call of a running worker goes through them, throttling
and transient errors are retried in virtual time within budget, and the last error of an
exhausted budget reaches the caller."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from kclasync import Consumer, ConsumerConfig
from kclasync._adapters.backends import AdapterBackend
from kclasync._adapters.memory import (
    MemoryCoordinatorState,
    MemoryLeaseStore,
    MemoryLeaseTable,
    MemoryStreamClient,
)
from kclasync._adapters.protocols import CoordinatorStateStore, LeaseStore, StreamClient
from kclasync._core.retry_policy import OP_CLASS, OpClass, RetryPolicy
from kclasync._runtime.retrying import (
    WRAPPERS,
    Retrier,
    RetryingLeaseStore,
    through_retrier,
)
from kclasync.errors import AdapterError, ThrottledError, TransientError
from tests.runtime.test_faults import Seen, fill
from tests.runtime.virtual import in_virtual_time
from tests.support import wait_until

STREAM = "s"


class Recording:
    """An adapter that notes, for every call, whether it came through a retry wrapper."""

    def __init__(self, inner: object) -> None:
        self._inner = inner
        self.calls: dict[str, int] = {}
        self.bare: list[str] = []

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if name not in OP_CLASS or not callable(value):
            return value

        async def call(*args: object, **kwargs: object) -> object:
            self.calls[name] = self.calls.get(name, 0) + 1
            if through_retrier() != name:
                self.bare.append(name)
            return await value(*args, **kwargs)

        return call


@in_virtual_time
async def test_every_adapter_call_of_a_worker_goes_through_the_retry_wrapper() -> None:
    client = MemoryStreamClient()
    payloads = fill(client, 4, 200)
    store = Recording(MemoryLeaseStore(MemoryLeaseTable()))
    locks = Recording(MemoryCoordinatorState())
    stream = Recording(client)
    seen = Seen()
    c = Consumer(
        stream_name=STREAM,
        application_name="app",
        processor=seen,
        config=ConsumerConfig(
            failover_time=0.6,
            initial_position="TRIM_HORIZON",
            idle_time_between_reads=0.02,
            min_time_between_reads=0.0,
            shard_sync_interval=0.5,
            worker_id="w",
        ),
        backend=AdapterBackend(
            cast(LeaseStore, store),
            cast(StreamClient, stream),
            locks=cast(CoordinatorStateStore, locks),
        ),
        registry=CollectorRegistry(),
        rng=random.Random(0),
    )
    async with c:
        await wait_until(lambda: len(seen.data) >= len(payloads), 20, "every record")
        # A split: the child waits for its parent (get_lease), the parent hands over.
        (first, *_) = sorted(seen.per_shard)
        client.split_shard(STREAM, first, 2**80)
        client.put_record(STREAM, "late", b"after the split")
        await wait_until(lambda: b"after the split" in seen.data, 20, "the child's record")
        await wait_until(lambda: c.is_leader, 5, "leadership")
        await wait_until(lambda: "renew_lease" in store.calls, 5, "a renewal")
    # Renewals, scans, takes, checkpoints, releases, lock calls, GetRecords, ListShards ...
    seen_ops = set(store.calls) | set(locks.calls) | set(stream.calls)
    for op in ("renew_lease", "list_leases", "take_lease", "checkpoint", "release_lease"):
        assert op in seen_ops
    assert {"get_records", "list_shards", "get_lock"} <= seen_ops
    assert store.bare == [] and locks.bare == [] and stream.bare == []


def test_runtime_parts_hold_only_wrapped_adapters() -> None:
    # Every runtime module gets its adapters from wiring.py, which wraps them; the only module
    # naming a wrapper's inner adapter is retrying.py itself.
    import ast
    import pathlib

    import kclasync._runtime as runtime

    root = pathlib.Path(runtime.__file__).parent
    for path in sorted(root.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "inner":
                assert path.name == "retrying.py", f"{path.name} reaches past a retry wrapper"
            if isinstance(node, ast.ImportFrom) and node.module and "_adapters." in node.module:
                # Only protocols and data types; never an AWS adapter implementation. Local
                # exceptions: the CPU reader's type (it reads /proc or cgroup files, no AWS
                # call to retry), and the bundle a backend hands the wiring (``Adapters``).
                names = {a.name for a in node.names}
                assert node.module in (
                    "kclasync._adapters.protocols",
                    "kclasync._adapters.worker_registry",
                    "kclasync._adapters.cpu_metrics",
                    "kclasync._adapters.backends",
                    # Fan-out subscriptions resubscribe by their own policy
                    # (``_core/records/fanout_session.py``), not the request retry table.
                    "kclasync._adapters.fanout",
                    "kclasync._adapters.fanout_errors",
                    "kclasync._adapters.fanout_subscription",
                ), f"{path.name} imports {node.module}: {names}"
    assert len(WRAPPERS) == 4


class Flaky:
    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "ok"


def retrier(**policy: float) -> Retrier:
    p = RetryPolicy(
        attempts=int(policy.get("attempts", 5)),
        base=policy.get("base", 0.1),
        cap=policy.get("cap", 1.0),
        budget=policy.get("budget", 10.0),
    )
    return Retrier(dict.fromkeys(OpClass, p), random.Random(1))


async def run_call(r: Retrier, fn: Callable[[], Awaitable[str]]) -> str:
    return await r.call("list_leases", fn)


@in_virtual_time
async def test_throttling_and_transient_errors_are_retried() -> None:
    r = retrier()
    flaky = Flaky([ThrottledError("slow down"), TransientError("500")])
    assert await run_call(r, flaky) == "ok"
    assert flaky.calls == 3
    assert r.retried == {"list_leases": 2}


@in_virtual_time
async def test_other_errors_are_not_retried() -> None:
    r = retrier()
    flaky = Flaky([AdapterError("access denied")])
    with pytest.raises(AdapterError, match="access denied"):
        await run_call(r, flaky)
    assert flaky.calls == 1


@in_virtual_time
async def test_an_exhausted_budget_raises_the_last_error_in_time() -> None:
    import asyncio

    r = retrier(attempts=100, base=0.05, cap=0.2, budget=1.0)
    flaky = Flaky([ThrottledError(f"throttled {i}") for i in range(1000)])
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(ThrottledError):
        await run_call(r, flaky)
    assert loop.time() - start <= 1.0
    assert flaky.calls > 5
    assert r.exhausted == {"list_leases": 1}


def test_a_missing_policy_is_refused() -> None:
    p = RetryPolicy(attempts=1, base=0.1, cap=0.1, budget=0)
    with pytest.raises(ValueError, match="no retry policy"):
        Retrier({OpClass.SCAN: p}, random.Random(0))
    store = RetryingLeaseStore(MemoryLeaseStore(MemoryLeaseTable()), retrier())
    assert store.inner is not None
