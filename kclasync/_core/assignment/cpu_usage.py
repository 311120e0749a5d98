"""CPU utilisation from counter snapshots: the parsing of each source's text and the arithmetic.

Owns: parsing cgroup v2 (``cpu.stat``, ``cpu.max``), cgroup v1 (``cpuacct.usage``,
``cpu.cfs_quota_us``, ``cpu.cfs_period_us``), ``/proc/stat``, ``/proc/self/cgroup`` and the ECS
task-metadata v4 documents (``/task`` and ``/task/stats``) into ``CpuSample`` counters, and
``utilisation`` between two samples (0-100; the first sample has no predecessor and gives 0).

Every source is reduced to two monotonic counters, ``busy`` and ``capacity``, in the same unit,
so utilisation is ``100 * d(busy) / d(capacity)``:

- cgroup v1/v2: busy = CPU seconds used by the group; capacity = elapsed seconds (from the
  caller's clock) times the CPUs the group may use (its quota, or every host CPU without one);
- ``/proc/stat``: busy = all jiffies but idle and iowait; capacity = all jiffies;
- ECS: busy = the task's containers' CPU nanoseconds times online CPUs over the task's CPU
  limit; capacity = the host's system CPU nanoseconds (the Docker stats formula).

Must not: open files, make requests or read clocks; the readers in
``kclasync._adapters.cpu_metrics`` do that.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CpuSample",
    "CpuStatsError",
    "cgroup_v1_limit_cpus",
    "cgroup_v1_sample",
    "cgroup_v2_limit_cpus",
    "cgroup_v2_sample",
    "ecs_sample",
    "ecs_task_cpu_limit",
    "parse_cgroup_v1_usage_ns",
    "parse_cgroup_v2_usage_usec",
    "parse_proc_self_cgroup",
    "proc_stat_sample",
    "utilisation",
]


class CpuStatsError(ValueError):
    """A CPU statistics document did not have the expected format."""


@dataclass(frozen=True, slots=True)
class CpuSample:
    busy: float
    capacity: float


def utilisation(previous: CpuSample | None, current: CpuSample) -> float:
    """Percent of the available CPU used between two samples, clamped to 0-100.

    No previous sample (the first reading) gives 0, as KCL 3.x does. A counter that went
    backwards (a restarted container, a reset group) also gives 0 rather than a negative value.
    """
    if previous is None:
        return 0.0
    busy = current.busy - previous.busy
    capacity = current.capacity - previous.capacity
    if capacity <= 0 or busy < 0 or not math.isfinite(busy / capacity):
        return 0.0
    return max(0.0, min(100.0, 100.0 * busy / capacity))


def _int(text: str, what: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise CpuStatsError(f"{what}: expected an integer, got {text.strip()[:40]!r}") from None


def _host_cpus(host_cpus: int) -> int:
    if host_cpus < 1:
        raise CpuStatsError(f"host CPU count must be >= 1, got {host_cpus}")
    return host_cpus


# cgroup v2 -------------------------------------------------------------------------------


def parse_cgroup_v2_usage_usec(cpu_stat: str) -> int:
    """``usage_usec`` from a cgroup v2 ``cpu.stat`` file."""
    for line in cpu_stat.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "usage_usec":
            return _int(parts[1], "cpu.stat usage_usec")
    raise CpuStatsError("cpu.stat: no usage_usec line")


def cgroup_v2_limit_cpus(cpu_max: str | None, host_cpus: int) -> float:
    """CPUs the group may use from ``cpu.max`` (``"$QUOTA $PERIOD"``, ``"max $PERIOD"`` or
    missing at the root: every host CPU)."""
    host = _host_cpus(host_cpus)
    if cpu_max is None or not cpu_max.strip():
        return float(host)
    parts = cpu_max.split()
    if len(parts) not in (1, 2):
        raise CpuStatsError(f"cpu.max: expected '$QUOTA $PERIOD', got {cpu_max.strip()[:40]!r}")
    if parts[0] == "max":
        return float(host)
    quota = _int(parts[0], "cpu.max quota")
    period = _int(parts[1], "cpu.max period") if len(parts) == 2 else 100_000
    if quota <= 0 or period <= 0:
        raise CpuStatsError(f"cpu.max: quota and period must be > 0, got {cpu_max.strip()!r}")
    return min(quota / period, float(host))


def cgroup_v2_sample(
    cpu_stat: str, cpu_max: str | None, now_seconds: float, host_cpus: int
) -> CpuSample:
    used = parse_cgroup_v2_usage_usec(cpu_stat) / 1e6
    return CpuSample(used, now_seconds * cgroup_v2_limit_cpus(cpu_max, host_cpus))


# cgroup v1 -------------------------------------------------------------------------------


def parse_cgroup_v1_usage_ns(cpuacct_usage: str) -> int:
    return _int(cpuacct_usage, "cpuacct.usage")


def cgroup_v1_limit_cpus(quota_us: str, period_us: str, host_cpus: int) -> float:
    """CPUs from ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``; a quota of -1 is unlimited."""
    host = _host_cpus(host_cpus)
    quota = _int(quota_us, "cpu.cfs_quota_us")
    if quota == -1:
        return float(host)
    period = _int(period_us, "cpu.cfs_period_us")
    if quota <= 0 or period <= 0:
        raise CpuStatsError(f"cfs quota/period must be > 0 (or quota -1), got {quota}/{period}")
    return min(quota / period, float(host))


def cgroup_v1_sample(
    cpuacct_usage: str, quota_us: str, period_us: str, now_seconds: float, host_cpus: int
) -> CpuSample:
    used = parse_cgroup_v1_usage_ns(cpuacct_usage) / 1e9
    return CpuSample(used, now_seconds * cgroup_v1_limit_cpus(quota_us, period_us, host_cpus))


def parse_proc_self_cgroup(text: str) -> tuple[str | None, str | None]:
    """The process's cgroup v2 path (``0::/path``) and cgroup v1 cpu controller path."""
    v2: str | None = None
    v1: str | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            v2 = path
        elif "cpu" in controllers.split(",") or "cpuacct" in controllers.split(","):
            v1 = path
    return v2, v1


# /proc/stat ------------------------------------------------------------------------------


def proc_stat_sample(proc_stat: str) -> CpuSample:
    """The aggregate ``cpu`` line: user nice system idle iowait irq softirq steal ..."""
    for line in proc_stat.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            fields = [_int(value, "/proc/stat cpu field") for value in parts[1:9]]
            if len(fields) < 4:
                raise CpuStatsError("/proc/stat: the cpu line has fewer than 4 fields")
            idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
            total = sum(fields)
            return CpuSample(float(total - idle), float(total))
    raise CpuStatsError("/proc/stat: no aggregate 'cpu' line")


# ECS task metadata v4 --------------------------------------------------------------------


def ecs_task_cpu_limit(task: Mapping[str, Any]) -> float | None:
    """The task's CPU limit in vCPUs (``Limits.CPU`` of ``/task``), or None without one."""
    limits = task.get("Limits")
    if not isinstance(limits, Mapping):
        return None
    cpu = limits.get("CPU")
    if isinstance(cpu, int | float) and not isinstance(cpu, bool) and cpu > 0:
        # Task-level CPU is given in vCPUs; values above 64 are CPU units (1024 per vCPU).
        return float(cpu) / 1024 if cpu > 64 else float(cpu)
    return None


def ecs_sample(stats: Mapping[str, Any], task_cpu_limit: float | None) -> CpuSample:
    """Counters from ``/task/stats`` (container id -> Docker stats; null for a stopped one)."""
    usage = 0.0
    system: float | None = None
    online: int | None = None
    for container_id, doc in sorted(stats.items()):
        if doc is None:
            continue
        if not isinstance(doc, Mapping):
            raise CpuStatsError(f"task stats: container {container_id!r} is not an object")
        cpu = doc.get("cpu_stats")
        if not isinstance(cpu, Mapping):
            raise CpuStatsError(f"task stats: container {container_id!r} has no cpu_stats")
        total = cpu.get("cpu_usage", {}).get("total_usage")
        sys_usage = cpu.get("system_cpu_usage")
        if not isinstance(total, int | float) or not isinstance(sys_usage, int | float):
            raise CpuStatsError(
                f"task stats: container {container_id!r} lacks total_usage/system_cpu_usage"
            )
        usage += float(total)
        system = float(sys_usage) if system is None else max(system, float(sys_usage))
        cpus = cpu.get("online_cpus")
        if isinstance(cpus, int) and cpus > 0:
            online = cpus
    if system is None:
        raise CpuStatsError("task stats: no running container")
    online = online or 1
    limit = task_cpu_limit if task_cpu_limit else float(online)
    return CpuSample(usage * online / limit, system)
