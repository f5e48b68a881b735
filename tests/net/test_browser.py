"""A real browser as a client: headless Chromium (where one is installed) loads a page from an
allowed origin on another port, which calls the listener with ``fetch`` as the official
TypeScript client does (credentials included, a bearer token, a JSON body): the preflight and
the answer must let the page read the result."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from functools import partial
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import orjson
import pytest
import trio
from net_support import DEADLINE, INITIALIZE, net_host

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

PAGE = """<!doctype html><html><body><script>
fetch(%(url)s, {
  method: "POST",
  credentials: "include",
  headers: {"Authorization": "Bearer " + %(token)s, "Content-Type": "application/json"},
  body: %(body)s,
}).then(
  async (r) => "status=" + r.status + "&connection=" + (r.headers.get("acp-connection-id") || "")
    + "&answer=" + encodeURIComponent(await r.text()),
  (e) => "error=" + encodeURIComponent(String(e)),
).then((report) => fetch("/report?" + report));
</script></body></html>"""


class PageServer:
    """Serves one page at ``/`` and takes the page's report at ``/report``."""

    def __init__(self) -> None:
        self.page = b""
        self.report: dict[str, str] | None = None
        self.reported = trio.Event()

    async def handle(self, stream: trio.SocketStream) -> None:
        async with stream:
            request = b""
            while b"\r\n\r\n" not in request:
                data = await stream.receive_some(65536)
                if not data:
                    return
                request += data
            target = request.split(b" ", 2)[1].decode()
            body = b""
            if target == "/":
                body = self.page
            elif target.startswith("/report?"):
                query = parse_qs(urlsplit(target).query)
                self.report = {key: values[0] for key, values in query.items()}
                self.reported.set()
            status = b"200 OK" if body or self.report else b"404 Not Found"
            await stream.send_all(
                b"HTTP/1.1 " + status + b"\r\nContent-Type: text/html\r\nConnection: close\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            )


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (chromium package)")
async def test_a_browser_page_from_an_allowed_origin_reads_the_answer_to_its_fetch() -> None:
    assert CHROMIUM is not None
    server = PageServer()
    profile = Path(tempfile.mkdtemp(prefix="macp-chromium-"))
    try:
        with trio.fail_after(DEADLINE):
            async with trio.open_nursery() as nursery:
                listeners = await nursery.start(
                    partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1")
                )
                page_port = listeners[0].socket.getsockname()[1]
                origin = f"http://127.0.0.1:{page_port}"
                async with net_host(allowed_origins=(origin,)) as host:
                    server.page = (
                        PAGE
                        % {
                            "url": orjson.dumps(host.url).decode(),
                            "token": orjson.dumps(host.token).decode(),
                            "body": orjson.dumps(INITIALIZE.decode()).decode(),
                        }
                    ).encode()
                    browser = await nursery.start(
                        partial(
                            trio.run_process,
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                            check=False,
                        ),
                        [
                            CHROMIUM,
                            "--headless=new",
                            "--no-sandbox",
                            "--disable-gpu",
                            "--no-first-run",
                            f"--user-data-dir={profile}",
                            f"{origin}/",
                        ],
                    )
                    await server.reported.wait()
                    browser.kill()
                nursery.cancel_scope.cancel()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    report = server.report
    assert report is not None
    assert "error" not in report, report
    assert report["status"] == "200"
    assert report["connection"]
    assert orjson.loads(report["answer"])["result"]["protocolVersion"] == 1
