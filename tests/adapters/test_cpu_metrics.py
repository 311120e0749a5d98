"""The CPU readers against real files in a directory tree and a real HTTP server on 127.0.0.1
serving recorded ECS task-metadata documents; and detection of the source that applies."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from kclasync._adapters.cpu_metrics import (
    CgroupV1Reader,
    CgroupV2Reader,
    EcsTaskReader,
    ProcStatReader,
    detect_cpu_reader,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "cpu"


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def put(directory: Path, name: str, fixture: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(FIXTURES / fixture, directory / name)


async def test_cgroup_v2_reader_reads_deltas_against_the_passed_clock(tmp_path: Path) -> None:
    put(tmp_path, "cpu.stat", "cgroup_v2_cpu.stat.0")
    put(tmp_path, "cpu.max", "cgroup_v2_cpu.max")
    clock = Clock(1000.0)
    reader = CgroupV2Reader(tmp_path, clock, host_cpus=8)
    assert reader.cores is None  # told once it has read the group's limit
    assert await reader.sample() == 0.0
    assert reader.cores == 1.5  # the quota: 150000 / 100000
    put(tmp_path, "cpu.stat", "cgroup_v2_cpu.stat.1")
    clock.now += 10.0
    assert await reader.sample() == pytest.approx(60.0)
    # No cpu.max (the root group): every host CPU. Same counters: nothing used since.
    (tmp_path / "cpu.max").unlink()
    clock.now += 10.0
    assert await reader.sample() == 0.0
    assert reader.cores == 8.0


async def test_cgroup_v1_reader_unlimited_quota(tmp_path: Path) -> None:
    put(tmp_path, "cpuacct.usage", "cgroup_v1_cpuacct.usage.0")
    put(tmp_path, "cpu.cfs_quota_us", "cgroup_v1_cpu.cfs_quota_us.unlimited")
    put(tmp_path, "cpu.cfs_period_us", "cgroup_v1_cpu.cfs_period_us")
    clock = Clock(5.0)
    reader = CgroupV1Reader(tmp_path, clock, host_cpus=8)
    assert await reader.sample() == 0.0
    assert reader.cores == 8.0  # no quota: every host CPU
    put(tmp_path, "cpuacct.usage", "cgroup_v1_cpuacct.usage.1")
    clock.now += 5.0
    assert await reader.sample() == pytest.approx(12.5)


async def test_proc_stat_reader(tmp_path: Path) -> None:
    put(tmp_path, "stat", "proc_stat.0")
    reader = ProcStatReader(tmp_path / "stat", host_cpus=4)
    assert reader.cores == 4.0  # the host's, known from the start
    assert await reader.sample() == 0.0
    put(tmp_path, "stat", "proc_stat.1")
    assert await reader.sample() == pytest.approx(60.0)


async def test_proc_stat_reader_on_this_host_is_within_range() -> None:
    reader = ProcStatReader()
    assert await reader.sample() == 0.0
    assert 0.0 <= await reader.sample() <= 100.0


@pytest.fixture
async def ecs_server() -> AsyncIterator[tuple[str, list[str]]]:
    """A task-metadata endpoint on a free port: /task, then /task/stats from the recorded
    documents in order (the last one repeats)."""
    served: list[str] = []
    stats = ["ecs_task_stats.0.json", "ecs_task_stats.1.json"]

    async def task(request: web.Request) -> web.Response:
        served.append("task")
        return web.Response(
            body=(FIXTURES / "ecs_task.json").read_bytes(), content_type="application/json"
        )

    async def task_stats(request: web.Request) -> web.Response:
        name = stats[min(served.count("stats"), len(stats) - 1)]
        served.append("stats")
        return web.Response(body=(FIXTURES / name).read_bytes(), content_type="application/json")

    app = web.Application()
    app.router.add_get("/v4/abc-123/task", task)
    app.router.add_get("/v4/abc-123/task/stats", task_stats)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/v4/abc-123", served
    finally:
        await runner.cleanup()


async def test_ecs_reader_against_a_local_metadata_endpoint(
    ecs_server: tuple[str, list[str]],
) -> None:
    base, served = ecs_server
    reader = detect_cpu_reader(Clock(0.0), environ={"ECS_CONTAINER_METADATA_URI_V4": base})
    assert isinstance(reader, EcsTaskReader)
    try:
        assert await reader.sample() == 0.0
        assert reader.cores == 2.0  # the task's Limits.CPU
        assert await reader.sample() == pytest.approx(75.0)
        assert await reader.sample() == 0.0  # same counters again
    finally:
        await reader.close()
    assert served == ["task", "stats", "stats", "stats"]  # the task limit is read once


def test_detect_prefers_the_process_cgroup_v2(tmp_path: Path) -> None:
    proc, sysfs = tmp_path / "proc", tmp_path / "sys"
    put(proc / "self", "cgroup", "proc_self_cgroup.v2")
    put(proc, "stat", "proc_stat.0")
    group = sysfs / "kubepods.slice/kubepods-burstable.slice/cri-containerd-3f1c.scope"
    put(group, "cpu.stat", "cgroup_v2_cpu.stat.0")
    (group / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    reader = detect_cpu_reader(
        Clock(0.0), environ={}, sys_root=sysfs, proc_root=proc, host_cpus=2, platform="linux"
    )
    assert isinstance(reader, CgroupV2Reader)
    assert reader.directory == group


def test_detect_cgroup_v1_then_proc_stat_then_nothing(tmp_path: Path) -> None:
    proc, sysfs = tmp_path / "proc", tmp_path / "sys"
    put(proc / "self", "cgroup", "proc_self_cgroup.v1")
    put(proc, "stat", "proc_stat.0")
    kwargs = {"environ": {}, "sys_root": sysfs, "proc_root": proc, "host_cpus": 2}
    assert isinstance(detect_cpu_reader(Clock(0.0), platform="linux", **kwargs), ProcStatReader)
    group = sysfs / "cpu,cpuacct" / "docker" / "5b1e7c0a9f"
    put(group, "cpuacct.usage", "cgroup_v1_cpuacct.usage.0")
    put(group, "cpu.cfs_quota_us", "cgroup_v1_cpu.cfs_quota_us")
    put(group, "cpu.cfs_period_us", "cgroup_v1_cpu.cfs_period_us")
    reader = detect_cpu_reader(Clock(0.0), platform="linux", **kwargs)
    assert isinstance(reader, CgroupV1Reader)
    assert reader.directory == group
    assert detect_cpu_reader(Clock(0.0), platform="darwin", **kwargs) is None


def test_detect_cgroup_v1_with_separate_cpu_and_cpuacct_hierarchies(tmp_path: Path) -> None:
    proc, sysfs = tmp_path / "proc", tmp_path / "sys"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("2:cpuacct:/\n1:cpu:/\n0::/\n")
    put(sysfs / "cpuacct", "cpuacct.usage", "cgroup_v1_cpuacct.usage.0")
    put(sysfs / "cpu", "cpu.cfs_quota_us", "cgroup_v1_cpu.cfs_quota_us")
    put(sysfs / "cpu", "cpu.cfs_period_us", "cgroup_v1_cpu.cfs_period_us")
    put(sysfs / "cpu", "cpu.stat", "cgroup_v2_cpu.stat.0")  # v1's cpu.stat: not a v2 group
    reader = detect_cpu_reader(
        Clock(0.0), environ={}, sys_root=sysfs, proc_root=proc, host_cpus=2, platform="linux"
    )
    assert isinstance(reader, CgroupV1Reader)
    assert (reader.directory, reader.quota_directory) == (sysfs / "cpuacct", sysfs / "cpu")


async def test_the_reader_detected_on_this_host_measures_within_range() -> None:
    if not sys.platform.startswith("linux"):
        assert detect_cpu_reader(time.monotonic, environ={}) is None
        return
    reader = detect_cpu_reader(time.monotonic, environ={})
    assert reader is not None and reader.source in {"cgroup-v2", "cgroup-v1", "proc-stat"}
    assert await reader.sample() == 0.0
    deadline = time.monotonic() + 0.05
    while time.monotonic() < deadline:  # some CPU to measure
        sum(range(1000))
    assert 0.0 <= await reader.sample() <= 100.0
