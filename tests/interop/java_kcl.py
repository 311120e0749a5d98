"""The real Java KCL 3.x for interop tests: the MultiLangDaemon shipped in the PyPI wheel
``kclpy-ext`` (its jars sit in the ``amazon_kclpy.jars`` package), run on Java 17 against the
local emulators.

Owns: writing the daemon's properties (endpoints, dummy credentials, shortened timings), starting
and stopping one JVM, the class data sharing archive its starts map, reading its log, and reading
what the Python record processor (``kcl_processor.py``) wrote. Nothing here decides whether a
scenario passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping

import attrs

from kclasync.testing.emulators import REGION, LocalAws
from tests.interop.fleet import (
    JAVA_ASSIGNMENT_INTERVAL,
    Delivery,
    read_deliveries,
    stop_process_group,
)
from tests.support import aws_for

HERE = pathlib.Path(__file__).resolve().parent
PROCESSOR = HERE / "kcl_processor.py"
MAIN_CLASS = "software.amazon.kinesis.multilang.MultiLangDaemon"

#: Log lines that mean the Java KCL met an item it cannot parse in the lease table.
PARSE_FAILURES = (
    "Failed to deserialize lease",
    "NullPointerException",
    "leaseCounter is marked non-null",
    "Leases that failed deserialization",
)

#: Timings shortened so that a scenario runs in tens of seconds. A leader's lease assignment
#: runs every leaseAssignmentIntervalMillis (``fleet.JAVA_ASSIGNMENT_INTERVAL``; by default 2 x
#: failoverTimeMillis, which would be 6 s: its first run on a new worker finds no worker
#: metrics yet, so a worker alone reads a whole interval later); worker metrics are reported
#: every workerMetricsReporterFreqInMillis.
#: Not configurable: the leader lock's leaseDuration (120 s) and the 30 s heartbeat, which is
#: also how often a worker that is not the leader looks at the lock.
FAST_PROPERTIES: Mapping[str, str] = {
    "initialPositionInStream": "TRIM_HORIZON",
    "metricsLevel": "NONE",
    "retrievalMode": "POLLING",
    "failoverTimeMillis": "3000",
    "leaseAssignmentIntervalMillis": str(round(JAVA_ASSIGNMENT_INTERVAL * 1000)),
    "shardSyncIntervalMillis": "5000",
    "idleTimeBetweenReadsInMillis": "200",
    "parentShardPollIntervalMillis": "1000",
    # A graceful stop in the middle of shard ends needs more than 5 s; past this the daemon
    # exits without releasing its leases and the leader lock.
    "shutdownGraceMillis": "20000",
    "workerMetricsReporterFreqInMillis": "2000",
    "inMemoryWorkerMetricsCaptureFrequencyMillis": "500",
}


#: The client JIT only and one GC thread: the daemon's start-up (class loading of the AWS SDK)
#: costs less CPU, which matters on a two-core machine running other tests beside it; a test's
#: few hundred records per second need no optimising compiler.
JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")

#: The log line after which a daemon has loaded the classes of its start-up.
INITIALIZED = "Initialization complete. Starting worker loop."
#: The log line after which a gracefully stopping daemon has had its processors' answers to
#: ``shutdownRequested`` (their checkpoints), released the leader lock and stopped renewing
#: leases; what follows is waiting for the processors' final shutdown until the failover time.
STOPPED_TRACKING = "has successfully stopped lease-tracking threads"


def kcl_jars() -> pathlib.Path | None:
    """The directory holding the KCL jars of the installed ``kclpy-ext``, or None."""
    try:
        import amazon_kclpy.jars as jars  # type: ignore[import-untyped]
    except ImportError:
        return None
    path = pathlib.Path(jars.__file__).parent
    return path if any(path.glob("amazon-kinesis-client-multilang-*.jar")) else None


def java_executable() -> str | None:
    return shutil.which("java")


@attrs.frozen
class Processed:
    """Every record the Java side handed to the processor: (key, counter) -> deliveries, and
    the first (shard, sequence number) each was seen at."""

    deliveries: Counter[tuple[str, int]]
    shards: frozenset[str]
    positions: dict[tuple[str, int], tuple[str, str]]

    def keys(self) -> set[tuple[str, int]]:
        return set(self.deliveries)


class JavaKcl:
    """One MultiLangDaemon JVM. Use ``start()``/``stop()`` or the context manager ``run()``."""

    def __init__(
        self,
        local: LocalAws,
        *,
        stream: str,
        application: str,
        worker_id: str,
        workdir: pathlib.Path,
        properties: Mapping[str, str] | None = None,
        jvm_options: tuple[str, ...] = (),
    ) -> None:
        jars = kcl_jars()
        java = java_executable()
        if jars is None or java is None:
            raise FileNotFoundError("the Java KCL needs `java` and the kclpy-ext wheel")
        self.jars = jars
        self.java = java
        self.jvm_options = jvm_options
        self.local = local
        self.worker_id = worker_id
        self.workdir = workdir
        self.properties_file = workdir / f"{worker_id}.properties"
        self.log_file = workdir / f"{worker_id}.log"
        self.out_file = workdir / f"{worker_id}.records"
        props = {
            "executableName": f"{sys.executable} {PROCESSOR}",
            "streamName": stream,
            "applicationName": application,
            "AwsCredentialsProvider": "DefaultCredentialsProvider",
            "processingLanguage": "python/3",
            "regionName": REGION,
            "kinesisEndpoint": local.kinesis_endpoint_url or local.endpoint_url,
            "dynamoDBEndpoint": local.endpoint_url,
            "workerId": worker_id,
            **FAST_PROPERTIES,
            **(properties or {}),
        }
        self.properties_file.write_text("".join(f"{k} = {v}\n" for k, v in props.items()))
        self._proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

    def command(self) -> list[str]:
        return [
            self.java,
            *JVM_OPTIONS,
            *self.jvm_options,
            "-cp",
            f"{self.jars}/*",
            MAIN_CLASS,
            "-p",
            str(self.properties_file),
        ]

    def start(self) -> None:
        assert self._proc is None, "one JVM per JavaKcl"
        env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": REGION,
            "KCL_INTEROP_OUT": str(self.out_file),
        }
        self.out_file.touch()
        with open(self.log_file, "ab") as log:
            self._proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.workdir,
                start_new_session=True,
            )
        self.started_at = time.monotonic()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, *, kill: bool = False, grace: float = 45.0, group: bool = False) -> int | None:
        """SIGTERM (the daemon's graceful shutdown) or SIGKILL; SIGKILL after ``grace`` anyway.
        The SIGTERM goes to the JVM alone, so that the processor children live to answer the
        daemon's ``shutdownRequested`` (about 5 s in all; with ``group=True`` it goes to the
        whole process group: the children die at once and the daemon waits for their answers
        until the failover time or ``shutdownGraceMillis`` runs out, up to 20 s). Whatever is
        left of the group is killed afterwards."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if not group and not kill and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace)
        return stop_process_group(proc, kill=kill, grace=grace)

    def begin_stop(self) -> None:
        """SIGTERM to the JVM alone (its graceful shutdown begins), without waiting for its
        exit; ``stop()`` afterwards waits or kills."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)

    @contextlib.contextmanager
    def run(self) -> Iterator[JavaKcl]:
        self.start()
        try:
            yield self
        finally:
            self.stop()

    def log(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def parse_failures(self) -> list[str]:
        """Log lines showing that the daemon met an item it could not parse as a lease."""
        return [line for line in self.log().splitlines() if any(p in line for p in PARSE_FAILURES)]

    def log_lines(self, pattern: str) -> list[str]:
        rx = re.compile(pattern)
        return [line for line in self.log().splitlines() if rx.search(line)]

    def processed(self) -> Processed:
        """The records delivered so far, counted (the single-scenario tests' view)."""
        deliveries: Counter[tuple[str, int]] = Counter()
        shards: set[str] = set()
        positions: dict[tuple[str, int], tuple[str, str]] = {}
        for d in self.deliveries():
            shards.add(d.shard)
            deliveries[d.rid] += 1
            positions.setdefault(d.rid, (d.shard, str(d.seq)))
        return Processed(deliveries, frozenset(shards), positions)

    def deliveries(self) -> list[Delivery]:
        """Every record the Java side handed to the processor (``kcl_processor.py``)."""
        return read_deliveries(self.out_file, self.worker_id)


def class_archive_name() -> str:
    """A file name for the class data sharing archive of this JDK, these jars and these JVM
    options (an archive made for others is not used: the JVM checks it and starts without)."""
    jars, java = kcl_jars(), java_executable()
    assert jars is not None and java is not None
    home = pathlib.Path(java).resolve().parent.parent
    parts = [str(home), *JVM_OPTIONS]
    for path in (home / "lib" / "modules", *sorted(jars.glob("*.jar"))):
        if path.exists():
            parts.append(f"{path.name} {path.stat().st_size} {path.stat().st_mtime_ns}")
    return "kcl-" + hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16] + ".jsa"


def make_class_archive(local: LocalAws, workdir: pathlib.Path, target: pathlib.Path) -> bool:
    """Class data sharing for the daemons: one daemon runs until its scheduler has started (on a
    lease table with leases: no random wait) and is stopped gracefully; the JVM writes the
    classes it loaded (``-XX:ArchiveClassesAtExit``) and later daemons map them
    (``-XX:SharedArchiveFile``) instead of loading them from the jars. Measured on a quiet
    machine: 8.1 -> 7.2 s from a daemon's start to its first record, 3.3 -> 2.3 s of CPU; the
    archive run costs about 6 s. Runs in a thread of its own (its own event loop); False if no
    archive came out."""
    partial = target.with_suffix(".partial")
    name = f"cds-{time.time_ns() % 10**10}"

    async def run() -> None:
        async with aws_for(local, name) as aws:
            await aws.create_stream(1)
            await aws.create_leases()
            daemon = JavaKcl(
                local,
                stream=name,
                application=name,
                worker_id=name,
                workdir=workdir,
                jvm_options=(f"-XX:ArchiveClassesAtExit={partial}",),
            )
            daemon.start()
            try:
                deadline = time.monotonic() + 60
                while INITIALIZED not in daemon.log() and time.monotonic() < deadline:
                    assert daemon.running, daemon.log()[-3000:]
                    await asyncio.sleep(0.1)
            finally:
                daemon.stop()

    def in_thread() -> None:
        with contextlib.suppress(Exception):
            asyncio.run(run())

    thread = threading.Thread(target=in_thread, name="kcl-class-archive")
    thread.start()
    thread.join()
    if partial.exists() and partial.stat().st_size > 0:
        partial.replace(target)
        return True
    return False
