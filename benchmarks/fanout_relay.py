"""kinesis-local's fan-out relay (``kclasync.testing.fanout_proxy``) in its own process, so that
its CPU is not counted as the worker's in a benchmark.

    python benchmarks/fanout_relay.py UPSTREAM_URL     (prints the relay's URL, then serves)
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import Iterator

from kclasync.testing.fanout_proxy import KinesisLocalFanOutRelay


@contextlib.contextmanager
def relay_process(upstream: str) -> Iterator[str]:
    """The relay in a child process; yields its URL."""
    proc = subprocess.Popen([sys.executable, __file__, upstream], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        if not url.startswith("http"):
            raise RuntimeError("the fan-out relay did not start")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


async def _serve(upstream: str) -> None:
    async with KinesisLocalFanOutRelay(upstream) as url:
        print(url, flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(sys.argv[1]))
