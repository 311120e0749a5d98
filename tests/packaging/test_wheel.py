"""The built wheel, installed into a clean virtual environment from the package index, is a
worker's install: it imports without moto, pyspark or pyarrow, and says which extra to install
when the demo or the test emulators are used without moto."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.packaging

CHECK = """
import importlib.util, sys
for name in ("moto", "pyspark", "pyarrow", "anyio", "cfnlint", "sympy"):
    assert importlib.util.find_spec(name) is None, name + " is installed"
import kclasync, kclasync.logging, kclasync.integrations.asgi, kclasync.testing
from kclasync import Consumer, ConsumerConfig
from kclasync.dashboard._assets import ASSETS, asset
for path in ASSETS:  # every file the dashboard serves, the vendored chart library included
    assert asset(path) is not None and len(asset(path)[0]) > 500, path
assert b"uPlot" in asset("static/vendor/uPlot.iife.min.js")[0]
assert b"MIT License" in asset("static/vendor/uPlot.LICENSE")[0]
try:
    with kclasync.testing.embedded_moto():
        pass
except kclasync.testing.MissingExtraError as exc:
    print(exc)
else:
    sys.exit("embedded_moto() worked without moto")
"""


def _run(*args: str | Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=120, check=False, **kwargs
    )  # type: ignore[call-overload, no-any-return]


def test_wheel_installs_lean_and_names_the_demo_extra(tmp_path: Path) -> None:
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not installed")
    built = _run(uv, "build", "--wheel", "--out-dir", tmp_path / "dist", cwd=ROOT)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("kclasync-*.whl")
    venv = tmp_path / "venv"
    created = _run(uv, "venv", "--quiet", "--python", sys.executable, venv)
    assert created.returncode == 0, created.stderr
    python = venv / "bin" / "python"
    installed = _run(uv, "pip", "install", "--quiet", "--python", python, wheel)
    assert installed.returncode == 0, installed.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}

    checked = _run(python, "-c", CHECK, cwd=tmp_path, env=env)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.strip() == (
        "kclasync.testing needs the AWS emulator moto, which is not installed: "
        "pip install 'kclasync[demo]'"
    )

    demo = _run(venv / "bin" / "kclasync", "demo", cwd=tmp_path, env=env)
    assert demo.returncode == 1
    assert demo.stderr == (
        "kclasync demo: error: kclasync demo needs the AWS emulator moto, which is not "
        "installed: pip install 'kclasync[demo]'\n"
    )
    listed = _run(venv / "bin" / "kclasync", "--help", cwd=tmp_path, env=env)
    assert listed.returncode == 0 and "demo" in listed.stdout
