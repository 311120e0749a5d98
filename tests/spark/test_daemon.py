"""``spark.python.daemon.module=kclasync.integrations.spark_daemon``: Spark's Python workers are
forked with the source's AWS stack already imported, and the daemon imports nothing that starts
a thread (a forked child keeps only the thread that forked it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from kclasync.integrations.spark_daemon import PRELOADED

# A session of its own (the daemon module is fixed when the SparkContext starts): one task
# reports what its fresh worker had imported before the task ran, and who forked it.
SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from pyspark.sql import SparkSession

    def probe(_):
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            parent = f.read().replace(b"\\0", b" ").decode()
        return {"parent": parent, "loaded": sorted(set(NAMES) & set(sys.modules))}

    NAMES = json.loads(sys.argv[1])
    spark = (
        SparkSession.builder.master("local[1]")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "512m")
        .config("spark.python.daemon.module", "kclasync.integrations.spark_daemon")
        .getOrCreate()
    )
    try:
        print(json.dumps(spark.sparkContext.parallelize([0], 1).map(probe).collect()[0]))
    finally:
        spark.stop()
    """
)


def test_workers_are_forked_with_the_aws_stack_imported() -> None:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    names = ["aiobotocore.session", "kclasync._adapters.kinesis", "pyarrow"]
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(names)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert "kclasync.integrations.spark_daemon" in seen["parent"], seen
    # Inherited from the daemon; pyarrow (which starts threads) only after the fork, by pyspark.
    assert seen["loaded"] == ["aiobotocore.session", "kclasync._adapters.kinesis"], seen


def test_preloaded_modules_start_no_thread() -> None:
    code = (
        "import importlib, os, sys, threading\n"
        f"for name in {list(PRELOADED)!r}: importlib.import_module(name)\n"
        "import pyspark.daemon\n"
        "print(len(os.listdir('/proc/self/task')), threading.active_count(),"
        " 'pyarrow' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["1", "1", "False"], out.stdout
