"""CPU utilisation parsing and arithmetic on captured files of every source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kclasync._core.assignment.cpu_usage import (
    CpuSample,
    CpuStatsError,
    cgroup_v1_limit_cpus,
    cgroup_v1_sample,
    cgroup_v2_limit_cpus,
    cgroup_v2_sample,
    ecs_sample,
    ecs_task_cpu_limit,
    parse_cgroup_v2_usage_usec,
    parse_proc_self_cgroup,
    proc_stat_sample,
    utilisation,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "cpu"


def text(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_first_sample_is_zero() -> None:
    assert utilisation(None, CpuSample(5.0, 10.0)) == 0.0


def test_counter_going_backwards_gives_zero_not_negative() -> None:
    assert utilisation(CpuSample(10.0, 10.0), CpuSample(5.0, 20.0)) == 0.0
    assert utilisation(CpuSample(1.0, 10.0), CpuSample(2.0, 10.0)) == 0.0


def test_utilisation_is_clamped_to_100() -> None:
    assert utilisation(CpuSample(0.0, 0.0), CpuSample(30.0, 10.0)) == 100.0


def test_cgroup_v2_with_quota() -> None:
    assert parse_cgroup_v2_usage_usec(text("cgroup_v2_cpu.stat.0")) == 8734215021
    assert cgroup_v2_limit_cpus(text("cgroup_v2_cpu.max"), host_cpus=8) == 1.5
    first = cgroup_v2_sample(text("cgroup_v2_cpu.stat.0"), text("cgroup_v2_cpu.max"), 100.0, 8)
    second = cgroup_v2_sample(text("cgroup_v2_cpu.stat.1"), text("cgroup_v2_cpu.max"), 110.0, 8)
    # 9 CPU seconds used in 10 s of 1.5 CPUs.
    assert utilisation(first, second) == pytest.approx(60.0)


def test_cgroup_v2_max_means_every_host_cpu() -> None:
    unlimited = text("cgroup_v2_cpu.max.unlimited")
    assert cgroup_v2_limit_cpus(unlimited, host_cpus=4) == 4.0
    assert cgroup_v2_limit_cpus(None, host_cpus=4) == 4.0
    first = cgroup_v2_sample(text("cgroup_v2_cpu.stat.0"), unlimited, 100.0, 4)
    second = cgroup_v2_sample(text("cgroup_v2_cpu.stat.1"), unlimited, 110.0, 4)
    assert utilisation(first, second) == pytest.approx(22.5)


def test_cgroup_v1_with_quota_and_unlimited() -> None:
    period = text("cgroup_v1_cpu.cfs_period_us")
    limited = text("cgroup_v1_cpu.cfs_quota_us")
    assert cgroup_v1_limit_cpus(limited, period, host_cpus=8) == 2.0
    a = cgroup_v1_sample(text("cgroup_v1_cpuacct.usage.0"), limited, period, 50.0, 8)
    b = cgroup_v1_sample(text("cgroup_v1_cpuacct.usage.1"), limited, period, 55.0, 8)
    assert utilisation(a, b) == pytest.approx(50.0)  # 5 CPU s in 5 s of 2 CPUs
    unlimited = text("cgroup_v1_cpu.cfs_quota_us.unlimited")
    assert cgroup_v1_limit_cpus(unlimited, period, host_cpus=8) == 8.0
    a = cgroup_v1_sample(text("cgroup_v1_cpuacct.usage.0"), unlimited, period, 50.0, 8)
    b = cgroup_v1_sample(text("cgroup_v1_cpuacct.usage.1"), unlimited, period, 55.0, 8)
    assert utilisation(a, b) == pytest.approx(12.5)


def test_proc_stat_counts_idle_and_iowait_as_idle() -> None:
    a, b = proc_stat_sample(text("proc_stat.0")), proc_stat_sample(text("proc_stat.1"))
    assert utilisation(a, b) == pytest.approx(60.0)


def test_proc_self_cgroup_paths() -> None:
    assert parse_proc_self_cgroup(text("proc_self_cgroup.v2")) == (
        "/kubepods.slice/kubepods-burstable.slice/cri-containerd-3f1c.scope",
        None,
    )
    assert parse_proc_self_cgroup(text("proc_self_cgroup.v1")) == (None, "/docker/5b1e7c0a9f")


def test_ecs_task_stats_against_the_task_limit() -> None:
    task = json.loads(text("ecs_task.json"))
    limit = ecs_task_cpu_limit(task)
    assert limit == 2.0
    a = ecs_sample(json.loads(text("ecs_task_stats.0.json")), limit)
    b = ecs_sample(json.loads(text("ecs_task_stats.1.json")), limit)
    # 1.5 s of CPU by both containers over 2 s of system time on 2 CPUs = 1.5 of 2 vCPUs.
    assert utilisation(a, b) == pytest.approx(75.0)


def test_ecs_without_a_task_limit_uses_online_cpus() -> None:
    assert ecs_task_cpu_limit({"Limits": {"Memory": 512}}) is None
    assert ecs_task_cpu_limit({"Limits": {"CPU": 1024}}) == 1.0
    a = ecs_sample(json.loads(text("ecs_task_stats.0.json")), None)
    b = ecs_sample(json.loads(text("ecs_task_stats.1.json")), None)
    assert utilisation(a, b) == pytest.approx(75.0)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: parse_cgroup_v2_usage_usec("user_usec 5\n"), "no usage_usec"),
        (lambda: cgroup_v2_limit_cpus("abc 100000", 2), "cpu.max quota"),
        (lambda: cgroup_v2_limit_cpus("0 100000", 2), "must be > 0"),
        (lambda: cgroup_v1_limit_cpus("-5", "100000", 2), "quota -1"),
        (lambda: cgroup_v1_limit_cpus("nan", "100000", 2), "cfs_quota_us"),
        (lambda: proc_stat_sample("intr 5 6\n"), "no aggregate"),
        (lambda: ecs_sample({"x": {"memory_stats": {}}}, 1.0), "no cpu_stats"),
        (lambda: ecs_sample({"x": None}, 1.0), "no running container"),
        (lambda: cgroup_v2_limit_cpus("max", 0), "host CPU count"),
    ],
)
def test_bad_documents_raise_a_specific_error(call: object, message: str) -> None:
    with pytest.raises(CpuStatsError, match=message):
        call()  # type: ignore[operator]
