"""A real browser for the network tests: headless Chromium opening a page that a small loopback
server serves (the page's origin), which then posts its report back to that server.

Without Chromium a test skips, except under CI, where it fails (``.ci/run`` installs it as
root)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from tests.e2e.x_display import under_ci

#: Bounds the whole browser run; a healthy one takes a few seconds.
BROWSER_DEADLINE = 60.0


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def require_chromium() -> str:
    """Chromium's path; skips the test without it (fails it under CI)."""
    browser = chromium()
    if browser is None:
        if under_ci(os.environ):
            pytest.fail("Chromium is missing; under CI it must run (.ci/run installs it as root)")
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    return browser


class PageServer:
    """Serves the page at ``/`` and takes the page's report at ``/result`` (HTTP/1.0-style:
    one request a connection)."""

    def __init__(self) -> None:
        self.page = b""
        self.report: Any = None
        self.reported = trio.Event()

    async def serve(self, nursery: trio.Nursery) -> str:
        """Listen on a loopback port in ``nursery``; return the page's origin."""
        listeners = await nursery.start(partial(trio.serve_tcp, self.handle, 0, host="127.0.0.1"))
        return f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"

    async def handle(self, stream: trio.SocketStream) -> None:
        async with stream:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            request_line, *header_lines = head.decode("latin-1").split("\r\n")
            method, target, _ = request_line.split(" ", 2)
            length = 0
            for line in header_lines:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            while len(body) < length:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                body += chunk
            if method == "POST" and target == "/result":
                self.report = orjson.loads(body)
                self.reported.set()
                answer, kind = b"ok", b"text/plain"
            elif target == "/":
                answer, kind = self.page, b"text/html; charset=utf-8"
            else:
                await stream.send_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                return
            await stream.send_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
                b"Connection: close\r\n\r\n%s" % (kind, len(answer), answer)
            )


async def open_page(browser: str, origin: str, pages: PageServer, nursery: trio.Nursery) -> None:
    """Open ``origin``'s page in headless Chromium and wait for its report; the browser (its
    whole process group) is killed once the page reported."""
    profile = Path(tempfile.mkdtemp(prefix="macp-chromium-"))
    command = [
        browser,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-extensions",
        f"--user-data-dir={profile}",
        f"{origin}/",
    ]
    try:
        with trio.fail_after(BROWSER_DEADLINE):
            process = await nursery.start(
                partial(
                    trio.run_process,
                    command,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    check=False,
                    # Its own process group: the renderers go with it.
                    start_new_session=True,
                )
            )
            try:
                await pages.reported.wait()
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
