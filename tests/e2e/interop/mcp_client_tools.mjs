// Drives `maple-acp acp` (argv: command..., then the project directory last) with the
// TypeScript SDK's experimental ACP v2 client, offering a tool that lives in this client: the
// SDK's own MCP-over-ACP provider serves the host's mcp/message requests (it checks each one
// against the schema and speaks the stateless MCP revision). A prompt has the demo call the
// tool. Prints one JSON line of what it saw; exits non-zero on any failure.
import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";
import * as acp from "@agentclientprotocol/sdk/experimental/v2/unstable";

const args = process.argv.slice(2);
const project = args.pop();
const child = spawn(args[0], args.slice(1), { stdio: ["pipe", "pipe", "inherit"] });
const stream = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));

const updates = [];
const waiters = [];
function seen() {
  for (const waiter of [...waiters]) {
    if (waiter.test()) {
      waiters.splice(waiters.indexOf(waiter), 1);
      waiter.resolve();
    }
  }
}
function until(test) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("timed out waiting")), 30000);
    waiters.push({ test, resolve: () => { clearTimeout(timer); resolve(); } });
    seen();
  });
}
const idle = (sid) => updates.some((u) => u.sessionId === sid &&
  u.update.sessionUpdate === "state_update" && u.update.state === "idle");

// The stateless revision's results say they are whole and how long they may be cached.
const WHOLE = { resultType: "complete", ttlMs: 0, cacheScope: "private" };
const inner = [];
async function pageTools(op) {
  inner.push({ method: op.method, version: op.protocolVersion, meta: op.envelopeMeta ?? null });
  if (op.method === "server/discover") {
    return { result: { supportedVersions: [op.protocolVersion], capabilities: { tools: {} }, ...WHOLE } };
  }
  if (op.method === "tools/list") {
    const now = { name: "now", description: "The client's clock", inputSchema: { type: "object", properties: {} } };
    return { result: { tools: [now], ...WHOLE } };
  }
  if (op.method === "tools/call" && op.params?.name === "now") {
    return { result: { content: [{ type: "text", text: "client clock" }], ...WHOLE } };
  }
  return { error: { code: -32601, message: "no such method or tool" } };
}

const provider = new acp.McpOverAcpProvider();
const app = acp.client({ name: "maple-acp-mcp-interop" })
  .onNotification(acp.methods.client.session.update, ({ params }) => {
    updates.push(params);
    seen();
  })
  .onRequest(acp.methods.client.session.requestPermission, ({ params }) => {
    const allow = params.options.find((o) => o.kind === "allow_once");
    return { outcome: { outcome: "selected", optionId: allow.optionId } };
  })
  .onRequest(acp.methods.client.mcp.message, provider.handleRequest);

const report = {};
await app.connectWith(stream, async (ctx) => {
  const init = await ctx.request(acp.methods.agent.initialize, {
    protocolVersion: 2,
    info: { name: "maple-acp-mcp-interop", version: "1" },
    capabilities: {},
  });
  report.acp = init.capabilities?.session?.mcp?.acp ?? null;
  const registration = provider.registerServer(ctx, { name: "page", handler: pageTools });
  const created = await ctx.request(acp.methods.agent.session.new, {
    cwd: project,
    mcpServers: [registration.declaration],
  });
  const sid = created.sessionId;
  report.setUp = inner.map((i) => i.method);
  await ctx.request(acp.methods.agent.session.prompt, {
    sessionId: sid,
    prompt: [{ type: "text", text: "/mcp page__now {}" }],
  });
  await until(() => idle(sid));
  report.inner = inner;
  report.sessionId = sid;
  const rows = updates.filter((u) => u.sessionId === sid && u.update.toolCallId);
  const last = rows[rows.length - 1]?.update ?? {};
  report.toolCallId = last.toolCallId ?? null;
  report.status = last.status ?? null;
  report.rawOutput = last.rawOutput ?? null;
  await ctx.request(acp.methods.agent.session.close, { sessionId: sid });
});
child.stdin.end();
console.log(JSON.stringify(report));
