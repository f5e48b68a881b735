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

from pathlib import Path

import orjson
import trio

from tests.e2e.browser_support import PageServer, open_page, require_chromium
from tests.net.net_support import net_host

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


async def test_a_browser_page_streams_over_fetch_and_websocket(tmp_path: Path) -> None:
    browser = require_chromium()
    pages = PageServer()
    async with trio.open_nursery() as nursery:
        origin = await pages.serve(nursery)
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
            await open_page(browser, origin, pages, nursery)
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
