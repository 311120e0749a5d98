"""The source on a standalone Spark cluster started from the pyspark install: a master and two
workers on 127.0.0.1, each worker with its own work directory, and no path shared between the
driver and the executors (progress in DynamoDB on moto, Kinesis on kinesis-local).

Across a split and a driver killed with SIGKILL mid-run and restarted, every record arrives
exactly once and a child shard's rows come in later batches than its parent's.

It starts five JVMs (master, two workers, driver, executors) and takes minutes on two cores, so
it runs only when asked:  KCLASYNC_SPARK_CLUSTER=1 uv run pytest tests/spark/test_cluster.py
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator

import pytest

from kclasync.testing.emulators import LocalAws, free_port
from tests.spark.support import create_and_produce, produce, source_options
from tests.spark.test_lineage import split_first_shard

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("KCLASYNC_SPARK_CLUSTER") != "1",
        reason="starts a standalone Spark cluster (minutes): set KCLASYNC_SPARK_CLUSTER=1",
    ),
    pytest.mark.timeout(1500),
]

ROOT = pathlib.Path(__file__).resolve().parents[2]


def spark_home() -> str:
    import pyspark

    return os.path.dirname(pyspark.__file__)


def spark_env(log_dir: pathlib.Path) -> dict[str, str]:
    return {
        **os.environ,
        "SPARK_HOME": spark_home(),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(log_dir),
        "SPARK_DAEMON_MEMORY": "256m",
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        "PYSPARK_PYTHON": sys.executable,
    }


def alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as resp:
            return int(json.load(resp).get("aliveworkers", 0))
    except OSError:
        return 0


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@pytest.fixture
def cluster(tmp_path: pathlib.Path) -> Iterator[str]:
    """``spark://127.0.0.1:<port>`` of a master with two 1-core workers."""
    spark_class = os.path.join(spark_home(), "bin", "spark-class")
    logs = tmp_path / "cluster-logs"
    logs.mkdir()
    env = spark_env(logs)
    port, ui = free_port(), free_port()
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, args: list[str]) -> None:
        out = open(logs / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
        procs.append(
            subprocess.Popen([spark_class, *args], env=env, stdout=out, stderr=out, cwd=tmp_path)
        )
        out.close()

    try:
        start(
            "master",
            [
                *("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"),
                *("--port", str(port), "--webui-port", str(ui)),
            ],
        )
        master = f"spark://127.0.0.1:{port}"
        for n in (1, 2):
            work = tmp_path / f"worker{n}"
            work.mkdir()
            start(
                f"worker{n}",
                [
                    *("org.apache.spark.deploy.worker.Worker", master, "--host", "127.0.0.1"),
                    *("--port", str(free_port()), "--webui-port", str(free_port())),
                    *("--cores", "1", "--memory", "768m", "--work-dir", str(work)),
                ],
            )
        deadline = time.monotonic() + 400
        while alive_workers(ui) < 2:
            assert all(p.poll() is None for p in procs), "a cluster process exited"
            assert time.monotonic() < deadline, "the workers did not register in 400 s"
            time.sleep(0.5)
        yield master
    finally:
        for proc in reversed(procs):
            stop(proc)


def driver(
    master: str, opts_file: pathlib.Path, ck: pathlib.Path, out: pathlib.Path, cwd: pathlib.Path
) -> subprocess.Popen[str]:
    cwd.mkdir(exist_ok=True)
    log = open(cwd / f"driver-{time.monotonic_ns()}.log", "wb")  # noqa: SIM115
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPARK_LOCAL_IP": "127.0.0.1"}
    env["SPARK_HOME"] = spark_home()
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "tests.spark.cluster_driver"),
            *(master, str(opts_file), str(ck), str(out)),
        ],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    log.close()
    return proc


def read_rows(out: pathlib.Path) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for path in sorted(out.glob("batch-*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines()]
    return rows


def test_exact_on_a_standalone_cluster_across_split_and_restart(
    cluster: str, kinesis: LocalAws, unique_name: str, tmp_path: pathlib.Path
) -> None:
    started = time.monotonic()
    before = create_and_produce(kinesis, unique_name, 2, 200)
    shards = split_first_shard(kinesis, unique_name)
    after = produce(kinesis, unique_name, 200, 200)
    parent = shards[0].shard_id
    children = {s.shard_id for s in shards if parent in s.parent_ids}

    opts = source_options(
        kinesis, unique_name, tmp_path, maxRecordsPerShard=40, progressTable=unique_name
    )
    assert "metadataPath" not in opts  # progress goes to DynamoDB
    opts_file = tmp_path / "options.json"
    opts_file.write_text(json.dumps(opts))
    ck, out = tmp_path / "driver" / "ck", tmp_path / "driver" / "out"

    # 1. The driver is killed with SIGKILL once two batches are written.
    first = driver(cluster, opts_file, ck, out, tmp_path / "driver")
    try:
        deadline = time.monotonic() + 600
        while len(list(out.glob("batch-*.jsonl"))) < 2:
            assert first.poll() is None, "the driver ended before it was killed"
            assert time.monotonic() < deadline, "no two batches in 600 s"
            time.sleep(0.2)
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            first.kill()
    killed_at = len(list(out.glob("batch-*.jsonl")))

    # 2. More records arrive; a new driver continues from the checkpoint.
    more = produce(kinesis, unique_name, 400, 100)
    second = driver(cluster, opts_file, ck, out, tmp_path / "driver")
    try:
        stdout, _ = second.communicate(timeout=600)
    finally:
        with contextlib.suppress(ProcessLookupError):
            second.kill()
    assert second.returncode == 0, stdout
    assert "done" in stdout

    rows = read_rows(out)
    counts = Counter(int(str(r["id"])) for r in rows)
    expected = set(before + after + more)
    duplicates = sum(counts.values()) - len(counts)
    elapsed = time.monotonic() - started
    sys.stderr.write(
        f"\ncluster run: {len(rows)} rows, {len(counts)} distinct of {len(expected)}, "
        f"{duplicates} duplicates, {len(list(out.glob('batch-*.jsonl')))} batches "
        f"(killed after {killed_at}), {elapsed:.0f}s\n"
    )
    assert set(counts) == expected
    assert duplicates == 0
    batches = [(str(r["shard"]), int(str(r["batch"]))) for r in rows]
    last_parent = max(b for s, b in batches if s == parent)
    assert min(b for s, b in batches if s in children) > last_parent
