"""Thin readers of this worker's CPU utilisation: cgroup v2, cgroup v1, /proc/stat, ECS.

Owns: reading the files or the ECS task-metadata endpoint and remembering the previous sample;
``detect_cpu_reader`` picks the source that applies to this process. All parsing and arithmetic
is in ``_core.assignment.cpu_usage``. Each ``sample()`` returns utilisation in percent (0-100);
the first call returns 0; after it, ``cores`` is the CPUs the source measures against (the
group's quota, the task's limit, or the host's CPUs; None when unknown). Time comes from the
``clock`` passed in (the runtime passes ``loop.time``); /proc/stat and ECS need no clock
(counter deltas only).

Must not: decide anything about assignment, or write the metrics anywhere.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from kclasync._core.assignment.cpu_usage import (
    CpuSample,
    CpuStatsError,
    cgroup_v1_limit_cpus,
    cgroup_v1_sample,
    cgroup_v2_limit_cpus,
    cgroup_v2_sample,
    ecs_sample,
    ecs_task_cpu_limit,
    parse_proc_self_cgroup,
    proc_stat_sample,
    utilisation,
)

__all__ = [
    "CgroupV1Reader",
    "CgroupV2Reader",
    "CpuReader",
    "EcsTaskReader",
    "ProcStatReader",
    "detect_cpu_reader",
]

ECS_ENV = "ECS_CONTAINER_METADATA_URI_V4"


class CpuReader(Protocol):
    source: str

    async def sample(self) -> float: ...

    async def close(self) -> None: ...


class _Delta:
    def __init__(self) -> None:
        self._previous: CpuSample | None = None
        #: The CPUs utilisation is measured against, as of the last sample (None: unknown).
        self.cores: float | None = None

    def _next(self, current: CpuSample) -> float:
        value = utilisation(self._previous, current)
        self._previous = current
        return value

    async def close(self) -> None:
        return None


class CgroupV2Reader(_Delta):
    source = "cgroup-v2"

    def __init__(self, directory: Path, clock: Callable[[], float], host_cpus: int) -> None:
        super().__init__()
        self.directory, self.clock, self.host_cpus = directory, clock, host_cpus

    async def sample(self) -> float:
        stat = (self.directory / "cpu.stat").read_text()
        max_path = self.directory / "cpu.max"
        cpu_max = max_path.read_text() if max_path.exists() else None
        self.cores = cgroup_v2_limit_cpus(cpu_max, self.host_cpus)
        return self._next(cgroup_v2_sample(stat, cpu_max, self.clock(), self.host_cpus))


class CgroupV1Reader(_Delta):
    """``cpuacct.usage`` from the cpuacct hierarchy and the CFS quota from the cpu hierarchy
    (one directory when they are co-mounted as ``cpu,cpuacct``)."""

    source = "cgroup-v1"

    def __init__(
        self,
        directory: Path,
        clock: Callable[[], float],
        host_cpus: int,
        quota_directory: Path | None = None,
    ) -> None:
        super().__init__()
        self.directory, self.clock, self.host_cpus = directory, clock, host_cpus
        self.quota_directory = quota_directory or directory

    async def sample(self) -> float:
        usage = (self.directory / "cpuacct.usage").read_text()
        quota = (self.quota_directory / "cpu.cfs_quota_us").read_text()
        period = (self.quota_directory / "cpu.cfs_period_us").read_text()
        self.cores = cgroup_v1_limit_cpus(quota, period, self.host_cpus)
        return self._next(cgroup_v1_sample(usage, quota, period, self.clock(), self.host_cpus))


class ProcStatReader(_Delta):
    source = "proc-stat"

    def __init__(self, path: Path = Path("/proc/stat"), host_cpus: int | None = None) -> None:
        super().__init__()
        self.path = path
        self.cores = float(host_cpus or os.cpu_count() or 1)

    async def sample(self) -> float:
        return self._next(proc_stat_sample(self.path.read_text()))


class EcsTaskReader(_Delta):
    """The task's CPU from ``$ECS_CONTAINER_METADATA_URI_V4/task/stats`` against the task's CPU
    limit from ``/task`` (read once)."""

    source = "ecs"

    def __init__(self, base_url: str, timeout_seconds: float = 2.0) -> None:
        super().__init__()
        self.base_url = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._session: aiohttp.ClientSession | None = None
        self._limit: float | None = None
        self._limit_known = False

    async def _get(self, path: str) -> Any:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        async with self._session.get(self.base_url + path) as response:
            response.raise_for_status()
            return await response.json(content_type=None)

    async def sample(self) -> float:
        if not self._limit_known:
            task = await self._get("/task")
            if not isinstance(task, Mapping):
                raise CpuStatsError("ECS /task: expected a JSON object")
            self._limit = ecs_task_cpu_limit(task)
            self._limit_known = True
            self.cores = self._limit
        stats = await self._get("/task/stats")
        if not isinstance(stats, Mapping):
            raise CpuStatsError("ECS /task/stats: expected a JSON object")
        return self._next(ecs_sample(stats, self._limit))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def detect_cpu_reader(
    clock: Callable[[], float],
    *,
    environ: Mapping[str, str] | None = None,
    sys_root: Path = Path("/sys/fs/cgroup"),
    proc_root: Path = Path("/proc"),
    host_cpus: int | None = None,
    platform: str = sys.platform,
) -> CpuReader | None:
    """The source for this process: ECS when its variable is set, else the process's cgroup
    (v2, then v1), else ``/proc/stat`` on Linux, else None (no CPU metric: the leader then
    balances this worker on throughput)."""
    env = os.environ if environ is None else environ
    if env.get(ECS_ENV):
        return EcsTaskReader(env[ECS_ENV])
    if not platform.startswith("linux"):
        return None
    cpus = host_cpus or _usable_cpus()
    try:
        v2_path, v1_path = parse_proc_self_cgroup((proc_root / "self" / "cgroup").read_text())
    except OSError:
        v2_path, v1_path = None, None
    if v2_path is not None:
        for directory in (sys_root / v2_path.lstrip("/"), sys_root):
            if (directory / "cgroup.controllers").is_file() and (directory / "cpu.stat").is_file():
                return CgroupV2Reader(directory, clock, cpus)
    usage_dir = _v1_directory(
        sys_root, v1_path, ("cpu,cpuacct", "cpuacct,cpu", "cpuacct"), "cpuacct.usage"
    )
    quota_dir = _v1_directory(
        sys_root, v1_path, ("cpu,cpuacct", "cpuacct,cpu", "cpu"), "cpu.cfs_quota_us"
    )
    if usage_dir is not None and quota_dir is not None:
        return CgroupV1Reader(usage_dir, clock, cpus, quota_directory=quota_dir)
    if (proc_root / "stat").is_file():
        return ProcStatReader(proc_root / "stat", host_cpus=os.cpu_count() or 1)
    return None


def _v1_directory(
    sys_root: Path, v1_path: str | None, mounts: tuple[str, ...], marker: str
) -> Path | None:
    """The process's directory in the first cgroup v1 hierarchy that has ``marker``."""
    for mount in mounts:
        base = sys_root / mount
        for directory in (base / (v1_path or "").lstrip("/"), base):
            if (directory / marker).is_file():
                return directory
    return None


def _usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask), else the host's count."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1
