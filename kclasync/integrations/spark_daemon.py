"""A PySpark daemon that has the ``kinesis`` source's AWS stack imported before it forks workers.

Spark starts an executor's Python workers by forking them from one daemon process per executor
(``spark.python.use.daemon``, on by default outside Windows), and a new worker imports what its
first task needs: for the ``kinesis`` source that is botocore, aiobotocore, aiohttp and
kclasync's adapters, about a second of CPU per worker. With

    spark.python.daemon.module = kclasync.integrations.spark_daemon

the daemon imports them once, before it forks, and every worker inherits them: a session's
first query, and every worker Spark starts later (after an idle timeout, a crashed worker or a
new executor), skips that import. Warm queries gain nothing: Spark reuses its workers
(``spark.python.worker.reuse``) and they keep what they imported.

Only modules that start no thread when imported are loaded here (a forked child has only the
thread that forked it): not pyarrow, pandas or ``kclasync.spark`` (whose package imports
pyarrow); the worker imports those after the fork, as pyspark's own daemon arranges.
This does not reach the driver: pyspark 4.3 starts the Python process that plans a streaming
source's batches as a plain process of its own for every query, never from a daemon.

Owns: those imports and handing over to pyspark's daemon (``pyspark.daemon.manager``).
Must not: start a thread, open a connection or read a setting before the fork.
"""

from __future__ import annotations

__all__ = ["PRELOADED", "main"]

#: What the daemon imports before it forks (the executors' read path, thread-free).
PRELOADED = (
    "aiohttp",
    "botocore.client",
    "aiobotocore.session",
    "kclasync._adapters.aws",
    "kclasync._adapters.kinesis",
    "kclasync._adapters.dynamodb",
    "kclasync._adapters.fanout",
    "kclasync._runtime.shard_cursor",
    "kclasync._core.records.kpl",
)


def main() -> None:
    """Import ``PRELOADED``, then run pyspark's daemon in this process."""
    import importlib

    for name in PRELOADED:
        importlib.import_module(name)
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()
