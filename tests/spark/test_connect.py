"""The source and the sink from a Spark Connect client: the client runs in a process of its
own, against a Connect server the test starts on the session's Spark (the service the
``remote("local[2]")`` mode starts, without a Spark of its own per client), the data source
registered through the client. Across a split and a restart of the query (a new session of the
client, the same checkpoint) every record arrives exactly once, children after their parent;
the sink puts every row."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from kclasync.testing.emulators import LocalAws, free_port
from tests.spark.support import create_and_produce, produce, source_options
from tests.spark.test_lineage import split_first_shard
from tests.support import aws_for

pytest.importorskip("grpc", reason="Spark Connect's client needs pyspark[connect]")

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def connect_server(spark: Any) -> Iterator[str]:
    """A Spark Connect server on the session's SparkContext (what the Connect plugin of
    ``remote("local[2]")`` starts), stopped after the test; yields its ``sc://`` address."""
    port = free_port()
    context = spark.sparkContext._jsc.sc()
    context.conf().set("spark.connect.grpc.binding.port", str(port))
    service = spark.sparkContext._jvm.org.apache.spark.sql.connect.service.SparkConnectService
    service.start(context)
    try:
        yield f"sc://127.0.0.1:{port}"
    finally:
        service.stop(getattr(service, "stop$default$1")(), getattr(service, "stop$default$2")())


class Client:
    """The Connect client process (``tests.spark.connect_driver``); its stderr goes to
    ``client.log`` in ``tmp``."""

    def __init__(self, args: list[str], tmp: pathlib.Path, remote: str) -> None:
        env = {
            **os.environ,
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "KCLASYNC_CONNECT_REMOTE": remote,
        }
        self.log = tmp / "client.log"
        with open(self.log, "w", encoding="utf-8") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.spark.connect_driver", *args],
                cwd=ROOT,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )

    def answer(self) -> list[str]:
        """The words of the client's next ``done`` line."""
        assert self.proc.stdout is not None
        seen = []
        for line in self.proc.stdout:
            seen.append(line)
            if line.startswith("done"):
                return line.split()
        self.proc.wait(60)
        tail = self.log.read_text(encoding="utf-8")[-4000:]
        raise AssertionError(f"client exited {self.proc.returncode}: {''.join(seen)}{tail}")

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            return self.proc.wait(120)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


def count_records(local: LocalAws, stream: str) -> int:
    async def go() -> int:
        async with aws_for(local, stream) as aws:
            total = 0
            for shard in await aws.stream.list_shards(stream):
                it = await aws.stream._client.get_shard_iterator(
                    StreamName=stream, ShardId=shard.shard_id, ShardIteratorType="TRIM_HORIZON"
                )
                iterator = it["ShardIterator"]
                while iterator:
                    page = await aws.stream._client.get_records(ShardIterator=iterator)
                    total += len(page["Records"])
                    if not page["Records"] and page.get("MillisBehindLatest", 0) == 0:
                        break
                    iterator = page.get("NextShardIterator")
            return total

    return asyncio.run(go())


@pytest.mark.timeout(900)
def test_source_and_sink_through_spark_connect(
    spark: Any,
    connect_server: str,
    kinesis: LocalAws,
    unique_name: str,
    tmp_path: pathlib.Path,
) -> None:
    from pyspark.sql import functions as F

    first = create_and_produce(kinesis, unique_name, 2, 200)
    opts = source_options(kinesis, unique_name, tmp_path, maxRecordsPerShard=60)
    (tmp_path / "opts.json").write_text(json.dumps(opts))
    out, ck, sink_file = tmp_path / "out", tmp_path / "ck", tmp_path / "sink.json"
    client = Client(
        [str(tmp_path / "opts.json"), str(ck), str(out), str(sink_file)], tmp_path, connect_server
    )
    try:
        _, read, first_session = client.answer()
        assert read == "200"

        shards = split_first_shard(kinesis, unique_name)
        parent = shards[0].shard_id
        children = {s.shard_id for s in shards if parent in s.parent_ids}
        second = produce(kinesis, unique_name, 200, 200)
        sink_stream = f"{unique_name}-out"
        create_and_produce(kinesis, sink_stream, 1, 0)
        sink = {
            "rows": 150,
            "options": {
                k: v
                for k, v in source_options(kinesis, sink_stream, tmp_path).items()
                if k in ("streamName", "endpointUrl", "region", "awsAccessKeyId", "awsSecretKey")
            },
        }
        sink_file.write_text(json.dumps(sink))
        # The restarted query: a new session, the same checkpoint.
        client.send("restart")
        _, read, second_session = client.answer()
        assert read == "200" and second_session != first_session
        assert client.answer() == ["done"]  # the sink's rows are put
    finally:
        assert client.close() == 0

    rows = spark.read.parquet(str(out))
    ids = [
        int(r[0])
        for r in rows.select(F.get_json_object(F.col("data").cast("string"), "$.id")).collect()
    ]
    assert sorted(ids) == sorted(first + second)  # every record, once
    batches = {(r[0], r[1]) for r in rows.select("shardId", "batch").distinct().collect()}
    last_parent = max(b for s, b in batches if s == parent)
    child_batches = [b for s, b in batches if s in children]
    assert child_batches and min(child_batches) > last_parent
    assert count_records(kinesis, sink_stream) == 150
