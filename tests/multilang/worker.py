"""``kclasync multilang`` in its own process for the tests: the same properties as the Java
daemon's in the interop suite (``tests.interop.java_kcl``), the same record processors
(``kcl_processor.py`` for amazon_kclpy v3, ``kcl_processor_v2.py`` for v2), and the same
delivery files. SIGTERM to the worker alone is a graceful stop (its children run in their own
process groups); SIGKILL kills the worker, whose children then see their stdin close and exit.

Owns: writing the properties file, starting and stopping the process, reading the log, the
deliveries and the processors' events. Nothing here decides whether a scenario passed.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import Mapping

from kclasync.testing.emulators import REGION, LocalAws
from tests.interop.fleet import Delivery, read_deliveries
from tests.interop.java_kcl import FAST_PROPERTIES

INTEROP = pathlib.Path(__file__).resolve().parent.parent / "interop"
V3_PROCESSOR = INTEROP / "kcl_processor.py"
V2_PROCESSOR = INTEROP / "kcl_processor_v2.py"
KCLASYNC = pathlib.Path(sys.executable).parent / "kclasync"


def daemon_properties(
    local: LocalAws,
    *,
    stream: str,
    application: str,
    worker_id: str,
    processor: pathlib.Path = V3_PROCESSOR,
    **overrides: str,
) -> dict[str, str]:
    """A MultiLangDaemon properties file's keys, as the interop suite gives them to Java."""
    return {
        "executableName": f"{sys.executable} {processor}",
        "streamName": stream,
        "applicationName": application,
        "AWSCredentialsProvider": "DefaultCredentialsProvider",
        "processingLanguage": "python/3",
        "regionName": REGION,
        "kinesisEndpoint": local.kinesis_endpoint_url or local.endpoint_url,
        "dynamoDBEndpoint": local.endpoint_url,
        "workerId": worker_id,
        **FAST_PROPERTIES,
        **overrides,
    }


def write_properties(path: pathlib.Path, props: Mapping[str, str]) -> pathlib.Path:
    path.write_text("".join(f"{k} = {v}\n" for k, v in props.items()))
    return path


class MultiLangWorker:
    """One ``kclasync multilang`` process."""

    def __init__(self, properties_file: pathlib.Path, *, worker_id: str, workdir: pathlib.Path):
        self.worker_id = worker_id
        self.properties_file = properties_file
        self.log_file = workdir / f"{worker_id}.log"
        self.out_file = workdir / f"{worker_id}.records"
        self.events_file = workdir / f"{worker_id}.records.events"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, extra_env: Mapping[str, str] | None = None) -> MultiLangWorker:
        self.out_file.touch()
        env = {
            **os.environ,
            **(extra_env or {}),
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": REGION,
            "KCL_INTEROP_OUT": str(self.out_file),
        }
        with open(self.log_file, "ab") as log:
            self._proc = subprocess.Popen(
                [str(KCLASYNC), "multilang", "--properties-file", str(self.properties_file)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.properties_file.parent,
                start_new_session=True,
            )
        return self

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def wait_exit(self) -> int | None:
        """The exit status, once the process has exited by itself; None while it runs."""
        return None if self._proc is None else self._proc.poll()

    def stop(self, *, kill: bool = False, grace: float = 30.0) -> int | None:
        """SIGTERM to the worker alone (graceful), or SIGKILL; SIGKILL after ``grace``."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def log(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def deliveries(self) -> list[Delivery]:
        return read_deliveries(self.out_file, self.worker_id)

    def events(self) -> list[tuple[str, str]]:
        """(shard, call) for every non-batch call the processors saw, in order."""
        if not self.events_file.exists():
            return []
        out = []
        for line in self.events_file.read_text().splitlines():
            shard, _, what = line.partition(" ")
            out.append((shard, what))
        return out
