"""A real browser as a client of the network listener: headless Chromium loads a page from an
allowed origin (a second loopback port), and the page's own script drives ACP the ways a
browser page can:

- Streamable HTTP with ``fetch()`` as the official TypeScript SDK's HTTP client calls it, with
  credentials included (its preflight needs ``Access-Control-Allow-Credentials``); the event
  stream is read with a ``fetch()`` body reader (``EventSource`` cannot send the token), and
  its first bytes must come at once, before any event (a proxy holding the headers until then
  would open it late);
- a WebSocket carrying the token as the ``acp.bearer.<token>`` subprotocol.

The page posts what it saw back to the page's server; the test judges it. Without Chromium the
test skips, except under CI, where it fails (``.ci/run`` installs it as root).
"""

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
from tests.net.net_support import net_host

#: Bounds the whole browser run; a healthy one takes a few seconds.
BROWSER_DEADLINE = 60.0
#: The event stream's first bytes must arrive within this of its opening (the keepalive
#: comes after 15 s, so a stream that writes nothing first fails it).
FIRST_BYTES_WITHIN_MS = 3000

_PAGE = r"""<!doctype html><meta charset="utf-8"><title>acp</title><script>
const ACP = %(acp)s, TOKEN = %(token)s, WS = %(ws)s;
const seen = {};
const auth = {'Authorization': 'Bearer ' + TOKEN};
function rpc(id, method, params) {
  const m = {jsonrpc: '2.0', method, params}; if (id !== null) m.id = id;
  return JSON.stringify(m);
}
async function post(conn, body, sessionId) {
  const headers = {...auth, 'Content-Type': 'application/json',
                   'Accept': 'application/json, text/event-stream'};
  if (conn) headers['Acp-Connection-Id'] = conn;
  if (sessionId) headers['Acp-Session-Id'] = sessionId;
  return fetch(ACP, {method: 'POST', credentials: 'include', headers, body});
}
function sseReader(response) {
  const reader = response.body.getReader(), decoder = new TextDecoder();
  let buffer = '';
  return {
    firstChunk: () => reader.read().then(r => {
      buffer += decoder.decode(r.value || new Uint8Array()); return r; }),
    async next() {
      while (true) {
        const end = buffer.indexOf('\n\n');
        if (end >= 0) {
          const raw = buffer.slice(0, end); buffer = buffer.slice(end + 2);
          const data = raw.split('\n').filter(l => l.startsWith('data: ')).map(l => l.slice(6));
          if (data.length) return JSON.parse(data.join('\n'));
          continue;
        }
        const r = await reader.read();
        if (r.done) throw new Error('the stream ended');
        buffer += decoder.decode(r.value, {stream: true});
      }
    },
    async until(done) { while (true) { const m = await this.next(); if (done(m)) return m; } },
  };
}
async function overHttp() {
  const init = await post(null, rpc(0, 'initialize', {protocolVersion: 1, clientCapabilities: {}}));
  seen.httpInitStatus = init.status;
  const conn = init.headers.get('acp-connection-id');
  seen.httpConnectionExposed = !!conn;
  const opened = performance.now();
  const stream = await fetch(ACP, {credentials: 'include',
                                   headers: {...auth, 'Accept': 'text/event-stream',
                                             'Acp-Connection-Id': conn}});
  const events = sseReader(stream);
  const first = await Promise.race([
    events.firstChunk().then(() => performance.now() - opened),
    new Promise(resolve => setTimeout(() => resolve(null), %(first_ms)d)),
  ]);
  seen.httpFirstBytesMs = first;
  if (first === null) return;
  await post(conn, rpc(1, 'session/new', {cwd: %(cwd)s, mcpServers: []}));
  const created = await events.until(m => m.id === 1);
  const sid = created.result.sessionId;
  await post(conn, rpc(2, 'session/prompt', {sessionId: sid,
                                             prompt: [{type: 'text', text: 'hello over fetch'}]}),
             sid);
  let text = '';
  const answer = await events.until(m => {
    if (m.method === 'session/update' && m.params.update.sessionUpdate === 'agent_message_chunk')
      text += m.params.update.content.text;
    return m.id === 2;
  });
  seen.httpStopReason = answer.result && answer.result.stopReason;
  seen.httpText = text;
}
function overWebSocket() {
  return new Promise(resolve => {
    const ws = new WebSocket(WS, ['acp', 'acp.bearer.' + TOKEN]);
    let text = '';
    ws.onopen = () => { seen.wsProtocol = ws.protocol;
      ws.send(rpc(0, 'initialize', {protocolVersion: 1, clientCapabilities: {}})); };
    ws.onmessage = event => {
      const m = JSON.parse(event.data);
      if (m.id === 0) ws.send(rpc(1, 'session/new', {cwd: %(cwd)s, mcpServers: []}));
      else if (m.id === 1) ws.send(rpc(2, 'session/prompt', {sessionId: m.result.sessionId,
          prompt: [{type: 'text', text: 'hello over a websocket'}]}));
      else if (m.method === 'session/update' &&
               m.params.update.sessionUpdate === 'agent_message_chunk')
        text += m.params.update.content.text;
      else if (m.id === 2) { seen.wsStopReason = m.result && m.result.stopReason;
                             seen.wsText = text; ws.close(); }
    };
    ws.onclose = () => resolve();
    ws.onerror = () => { seen.wsError = true; };
  });
}
(async () => {
  try { await overHttp(); } catch (e) { seen.httpError = String(e); }
  try { await overWebSocket(); } catch (e) { seen.wsError = String(e); }
  await fetch('/result', {method: 'POST', body: JSON.stringify(seen)});
})();
</script>"""


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class PageServer:
    """Serves the page at ``/`` and takes the page's report at ``/result`` (HTTP/1.0-style:
    one request a connection)."""

    def __init__(self) -> None:
        self.page = b""
        self.report: Any = None
        self.reported = trio.Event()

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


async def test_a_browser_page_streams_over_fetch_and_websocket(tmp_path: Path) -> None:
    browser = _chromium()
    if browser is None:
        if under_ci(os.environ):
            pytest.fail("Chromium is missing; under CI it must run (.ci/run installs it as root)")
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    pages = PageServer()
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, pages.handle, 0, host="127.0.0.1"))
        page_port = listeners[0].socket.getsockname()[1]
        origin = f"http://127.0.0.1:{page_port}"
        project = tmp_path / "project"
        project.mkdir()
        async with net_host(allowed_origins=(origin,)) as host:
            ws_url = host.url.replace("http://", "ws://", 1)
            values = {
                "acp": orjson.dumps(host.url).decode(),
                "token": orjson.dumps(host.token).decode(),
                "ws": orjson.dumps(ws_url).decode(),
                "cwd": orjson.dumps(str(project)).decode(),
                "first_ms": FIRST_BYTES_WITHIN_MS,
            }
            pages.page = (_PAGE % values).encode()
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
        nursery.cancel_scope.cancel()
    report = pages.report
    assert report.get("httpError") is None, report
    assert report["httpInitStatus"] == 200, report
    assert report["httpConnectionExposed"] is True, report
    assert report["httpFirstBytesMs"] is not None, (
        f"the event stream wrote nothing within {FIRST_BYTES_WITHIN_MS} ms of opening: {report}"
    )
    assert report["httpStopReason"] == "end_turn", report
    assert "hello over fetch" in report["httpText"], report
    assert report.get("wsError") is None, report
    assert report["wsProtocol"] == "acp", report
    assert report["wsStopReason"] == "end_turn", report
    assert "hello over a websocket" in report["wsText"], report
