"""A headless Chromium driven over the Chrome DevTools protocol (aiohttp websocket).

Test-only: launches Debian's ``chromium`` with a fresh profile and no network of its own, and
offers navigate / evaluate / screenshot on its first page.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import pathlib
import re
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
)


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Page:
    """One page target: commands go out with an id, answers are matched by that id."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self._ws:
            data = json.loads(message.data)
            future = self._waiting.pop(data.get("id", -1), None)
            if future is not None and not future.done():
                future.set_result(data)
        for future in self._waiting.values():
            future.set_exception(ConnectionError("DevTools connection closed"))

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        ident = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[ident] = future
        await self._ws.send_json({"id": ident, "method": method, "params": params})
        answer = await asyncio.wait_for(future, 30)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        result: dict[str, Any] = answer["result"]
        return result

    async def navigate(self, url: str) -> None:
        await self.send("Page.navigate", url=url)

    async def reload(self, timeout: float = 30.0) -> None:
        """Reload the page and return once the new document has loaded. ``location.reload()``
        returns at once and the old document answers until the new one commits, so a marker
        set on the old window tells the two apart."""
        await self.evaluate("window.__kclasyncBeforeReload = true; location.reload()")
        deadline = asyncio.get_running_loop().time() + timeout
        loaded = "!window.__kclasyncBeforeReload && document.readyState === 'complete'"
        while True:
            try:
                if await self.evaluate(loaded):
                    return
            except RuntimeError:  # the old document's context went away mid-call
                pass
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"the page did not load again within {timeout} s")
            await asyncio.sleep(0.1)

    async def evaluate(self, expression: str) -> Any:
        result = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def screenshot(self, path: str) -> None:
        height = await self.evaluate("document.documentElement.scrollHeight")
        await self.send(
            "Emulation.setDeviceMetricsOverride",
            width=1400,
            height=int(height),
            deviceScaleFactor=1,
            mobile=False,
        )
        shot = await self.send("Page.captureScreenshot", format="png")
        await asyncio.to_thread(pathlib.Path(path).write_bytes, base64.b64decode(shot["data"]))

    async def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        await self._ws.close()


@contextlib.asynccontextmanager
async def chromium_page() -> AsyncIterator[Page]:
    exe = chromium_path()
    assert exe is not None
    with tempfile.TemporaryDirectory(prefix="kclasync-chromium-") as profile:
        proc = await asyncio.create_subprocess_exec(
            exe, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
            "--window-size=1400,900", "about:blank",
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            assert proc.stderr is not None
            port = None
            async with asyncio.timeout(30):
                while port is None:
                    line = (await proc.stderr.readline()).decode()
                    assert line, "chromium exited before it listened for DevTools"
                    match = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
                    if match:
                        port = int(match.group(1))
            drain = asyncio.create_task(_drain(proc.stderr))
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{port}/json/list") as resp:
                    targets = await resp.json(content_type=None)
                url = next(t for t in targets if t["type"] == "page")["webSocketDebuggerUrl"]
                ws = await http.ws_connect(url, max_msg_size=0)
                page = Page(ws)
                try:
                    yield page
                finally:
                    await page.close()
            drain.cancel()
        finally:
            if proc.returncode is None:
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 5)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass
