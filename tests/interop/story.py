"""One application of the shared-tables scenarios (``test_shared_tables.py``): its clients,
its workers of both implementations, what they delivered, and the report of each handover and
mixed-fleet window."""

from __future__ import annotations

import logging
import os
import pathlib
from collections import Counter
from collections.abc import Callable
from typing import Any

import attrs

from kclasync.testing.emulators import LocalAws
from tests.interop.fleet import (
    Delivery,
    KclasyncProcess,
    Producer,
    Rid,
    Watch,
    beyond_checkpoints,
    checkpoints,
    delivered,
    produce,
)
from tests.interop.java_kcl import JavaKcl
from tests.support import Aws, wait_until

log = logging.getLogger("tests.interop.test_shared_tables")


@attrs.define
class Row:
    scenario: str
    produced: int
    lost: int
    reprocessed: int
    allowed: int
    until_read: float


@attrs.define
class Mixed:
    scenario: str
    seconds: int
    moves: int
    back_and_forth: dict[str, list[str]]


class Story:
    """One application: its clients, its workers of both kinds, what they delivered."""

    def __init__(
        self, aws: Aws, local: LocalAws, workdir: pathlib.Path, java: Callable[..., JavaKcl]
    ) -> None:
        self.aws, self.local, self.workdir, self._java = aws, local, workdir, java
        self.workdir.mkdir(exist_ok=True)
        self.workers: list[KclasyncProcess] = []
        self.jvms: list[JavaKcl] = []
        self.produced: set[Rid] = set()
        self.next = 0
        self.watch = Watch(aws)
        self.allowed: set[Rid] = set()  # records that may legitimately be delivered twice
        self.rows: list[Row] = []
        self.mixed: list[Mixed] = []

    async def produce(self, count: int) -> None:
        self.produced |= await produce(self.aws, self.next, count)
        self.next += count

    def producer(self, per_second: int) -> Producer:
        producer = Producer(self.aws, self.next, per_second)
        self.next += 10**6  # the producer's counters never meet later ones
        producer.start()
        return producer

    def kclasync(self, worker_id: str, *, held: bool = False, **config: Any) -> KclasyncProcess:
        """A kclasync worker process; ``held``: started, its worker not yet (``release()``)."""
        worker = KclasyncProcess(
            self.local,
            stream=self.aws.name,
            application=self.aws.name,
            worker_id=worker_id,
            workdir=self.workdir,
            **config,
        )
        self.workers.append(worker.start(held=held))
        return worker

    def java(self, worker_id: str) -> JavaKcl:
        daemon = self._java(stream=self.aws.name, application=self.aws.name, worker_id=worker_id)
        daemon.start()
        self.jvms.append(daemon)
        return daemon

    def deliveries(self) -> list[Delivery]:
        out = [d for w in self.workers for d in w.deliveries()]
        return out + [d for j in self.jvms for d in j.deliveries()]

    def check_alive(self) -> None:
        for jvm in self.jvms:
            failures = jvm.parse_failures()
            assert not failures, "the Java KCL could not parse an item:\n" + "\n".join(failures)
            assert not jvm.log_lines("invalid entries"), jvm.log_lines("invalid entries")[:3]
        assert not self.watch.not_leases, self.watch.not_leases[:3]

    async def all_read(self, what: str, timeout: float = 120.0) -> None:
        def done() -> bool:
            self.check_alive()
            return self.produced <= delivered(self.deliveries())

        await wait_until(done, timeout, what)

    async def killed_or_stopped(self, side: list[Delivery]) -> set[Rid]:
        """After a worker died or stopped: what it delivered beyond the checkpoints left."""
        allowed = beyond_checkpoints(side, await checkpoints(self.aws))
        self.allowed |= allowed
        return allowed

    def row(self, scenario: str, before: set[Rid], allowed: set[Rid], since: float) -> None:
        """A handover finished: everything produced was read; ``before`` is what the first
        side had delivered, ``since`` when the second side started."""
        after = [d for d in self.deliveries() if d.at >= since]
        redone = before & delivered(after)
        first = min((d.at for d in after), default=since)
        self.rows.append(
            Row(
                scenario,
                len(self.produced),
                len(self.produced - delivered(self.deliveries())),
                len(redone),
                len(allowed),
                round(first - since, 1),
            )
        )
        assert redone <= allowed, (scenario, sorted(redone - allowed)[:10])

    def duplicates(self) -> dict[Rid, int]:
        counts = Counter(d.rid for d in self.deliveries())
        return {rid: n for rid, n in counts.items() if n > 1}

    def stop_all(self) -> None:
        for worker in self.workers:
            worker.stop(kill=True)


def owners(story: Story) -> dict[str, str | None]:
    return dict(story.watch.samples[-1].owners) if story.watch.samples else {}


def leader(story: Story) -> str | None:
    return story.watch.samples[-1].leader if story.watch.samples else None


def report(*stories: Story) -> None:
    lines = [
        "| scenario | produced | lost | reprocessed (allowed) | s until the 2nd side read |",
        "|---|---|---|---|---|",
    ]
    for story in stories:
        lines += [
            f"| {r.scenario} | {r.produced} | {r.lost} | {r.reprocessed} ({r.allowed}) "
            f"| {r.until_read} |"
            for r in story.rows
        ]
    evidence = [
        line
        for story in stories
        for jvm in story.jvms
        for line in jvm.log_lines(
            r"is new leader|Total Leases available|Assigning lease : \S+ to worker : py"
        )[:6]
    ]
    mixed = [
        f"{m.scenario}: {m.seconds} s, {m.moves} lease moves by the leader, back and forth: "
        f"{m.back_and_forth or 'none'}"
        for story in stories
        for m in story.mixed
    ]
    text = "\n".join([*lines, "", *mixed, "", "Java log:", *evidence])
    log.warning("interop scenarios:\n%s", text)
    path = os.environ.get("KCL_INTEROP_REPORT")
    if path:
        pathlib.Path(path).write_text(text + "\n")
