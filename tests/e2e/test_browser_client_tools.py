"""A real browser page offers the agent a tool that lives in the page (MCP over ACP): headless
Chromium opens the page, whose script connects over a WebSocket, opens a session naming its own
MCP server (``type: "acp"``), answers the host's ``mcp/message`` requests by hand as
docs/remote.md shows, and has the demo call the tool; the page reports what it saw.

Without Chromium the test skips, except under CI, where it fails."""

from __future__ import annotations

from pathlib import Path

import orjson
import trio

from tests.e2e.browser_support import PageServer, open_page, require_chromium
from tests.net.net_support import net_host

_PAGE = r"""<!doctype html><meta charset="utf-8"><title>page tools</title><script>
const WS = %(ws)s, TOKEN = %(token)s, CWD = %(cwd)s;
const serverId = 'page-tools';
const tools = [{name: 'now', description: 'The time on the user\'s machine',
                inputSchema: {type: 'object', properties: {}}}];
const seen = {mcp: [], statuses: []};
function answerMcp({method, params}) {
  if (method === 'initialize') return {result: {protocolVersion: params.protocolVersion,
      capabilities: {tools: {}}, serverInfo: {name: 'page', version: '1'}}};
  if (method === 'tools/list') return {result: {tools}};
  if (method === 'tools/call' && params.name === 'now')
    return {result: {content: [{type: 'text', text: 'page clock ' + Date.now()}]}};
  return {error: {code: -32601, message: 'no such method or tool'}};
}
function rpc(id, method, params) { return JSON.stringify({jsonrpc: '2.0', id, method, params}); }
function run() {
  return new Promise(resolve => {
    const ws = new WebSocket(WS, ['acp', 'acp.bearer.' + TOKEN]);
    ws.onopen = () => ws.send(rpc(0, 'initialize', {protocolVersion: 1, clientCapabilities: {}}));
    ws.onmessage = event => {
      const m = JSON.parse(event.data);
      if (m.method === 'mcp/message' && m.params.serverId === serverId) {
        seen.mcp.push({method: m.params.method, meta: m.params._meta});
        ws.send(JSON.stringify({jsonrpc: '2.0', id: m.id, result: answerMcp(m.params)}));
      } else if (m.method === 'session/request_permission') {
        const allow = m.params.options.find(o => o.kind === 'allow_once');
        ws.send(JSON.stringify({jsonrpc: '2.0', id: m.id,
            result: {outcome: {outcome: 'selected', optionId: allow.optionId}}}));
      } else if (m.method === 'session/update') {
        const u = m.params.update;
        if (u.sessionUpdate === 'tool_call_update' && u.status) {
          seen.statuses.push(u.status);
          if (u.rawOutput) seen.toolText = u.rawOutput.content[0].text;
        }
      } else if (m.id === 0 && !m.method) {
        seen.acp = m.result.agentCapabilities.mcpCapabilities.acp;
        ws.send(rpc(1, 'session/new', {cwd: CWD,
            mcpServers: [{type: 'acp', name: 'page', serverId}]}));
      } else if (m.id === 1 && !m.method) {
        seen.sessionId = m.result && m.result.sessionId;
        ws.send(rpc(2, 'session/prompt', {sessionId: seen.sessionId,
            prompt: [{type: 'text', text: '/mcp page__now {}'}]}));
      } else if (m.id === 2 && !m.method) {
        seen.stopReason = m.result && m.result.stopReason;
        ws.close();
      }
    };
    ws.onclose = () => resolve();
    ws.onerror = () => { seen.wsError = true; };
  });
}
(async () => {
  try { await run(); } catch (e) { seen.error = String(e); }
  await fetch('/result', {method: 'POST', body: JSON.stringify(seen)});
})();
</script>"""


async def test_a_browser_page_offers_a_tool_through_mcp_over_acp(tmp_path: Path) -> None:
    browser = require_chromium()
    pages = PageServer()
    async with trio.open_nursery() as nursery:
        origin = await pages.serve(nursery)
        project = tmp_path / "project"
        project.mkdir()
        async with net_host(allowed_origins=(origin,)) as host:
            values = {
                "ws": orjson.dumps(host.url.replace("http://", "ws://", 1)).decode(),
                "token": orjson.dumps(host.token).decode(),
                "cwd": orjson.dumps(str(project)).decode(),
            }
            pages.page = (_PAGE % values).encode()
            await open_page(browser, origin, pages, nursery)
        nursery.cancel_scope.cancel()
    report = pages.report
    assert report.get("error") is None, report
    assert report.get("wsError") is None, report
    assert report["acp"] is True, report
    sid = report["sessionId"]
    assert [m["method"] for m in report["mcp"]] == ["initialize", "tools/list", "tools/call"]
    assert all(m["meta"]["maple.sessionId"] == sid for m in report["mcp"]), report
    assert "maple.toolCallId" in report["mcp"][-1]["meta"], report
    assert report["statuses"][-1] == "completed", report
    assert report["toolText"].startswith("page clock "), report
    assert report["stopReason"] == "end_turn", report
