// Drives `maple-acp serve --http` with the TypeScript SDK's Streamable HTTP client
// (argv: URL TOKEN PROJECT FRAMES): initialize, session/new, a streamed prompt, a permission
// allowed and one denied, a cancelled prompt, session/list; then a new connection (a
// reconnect) that loads the session, resumes it and closes it. Every message each way is
// written to FRAMES (one JSON object a line) for the test to check against the schema; one
// JSON line of what it saw goes to stdout. Any failure exits non-zero.
import { appendFileSync, writeFileSync } from "node:fs";
import * as acp from "@agentclientprotocol/sdk";
import { createHttpStream } from "@agentclientprotocol/sdk/experimental/http-client";

const [url, token, project, framesPath] = process.argv.slice(2);
writeFileSync(framesPath, "");
const log = (direction, message) =>
  appendFileSync(framesPath, JSON.stringify({ direction, message }) + "\n");

function recorded(stream) {
  // Request ids start again on each connection: the test checks each one apart.
  log("connection", null);
  const readable = stream.readable.pipeThrough(new TransformStream({
    transform(message, controller) { log("in", message); controller.enqueue(message); },
  }));
  const writer = stream.writable.getWriter();
  const writable = new WritableStream({
    async write(message) { log("out", message); await writer.write(message); },
    async close() { await writer.close(); },
    async abort(reason) { await writer.abort(reason); },
  });
  return { readable, writable };
}

function open() {
  return recorded(createHttpStream(url, { headers: { Authorization: `Bearer ${token}` } }));
}

function recorder(answers) {
  const state = { updates: [], asked: [], answers: [...answers] };
  state.app = acp.client({ name: "maple-acp-http-interop" })
    .onNotification(acp.methods.client.session.update, ({ params }) => {
      state.updates.push(params);
    })
    .onRequest(acp.methods.client.session.requestPermission, ({ params }) => {
      const wanted = state.answers.shift();
      state.asked.push(wanted);
      const option = params.options.find((o) => o.kind.startsWith(wanted));
      return { outcome: { outcome: "selected", optionId: option.optionId } };
    });
  state.text = (sid, kind = "agent_message_chunk") =>
    state.updates.filter((u) => u.sessionId === sid && u.update.sessionUpdate === kind)
      .map((u) => u.update.content?.text ?? "").join("");
  return state;
}

async function until(test) {
  const deadline = Date.now() + 20000;
  while (!test()) {
    if (Date.now() > deadline) throw new Error("timed out waiting");
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

const report = {};
const first = recorder(["allow", "reject"]);
let sid;
await first.app.connectWith(open(), async (ctx) => {
  const init = await ctx.request(acp.methods.agent.initialize, {
    protocolVersion: 1,
    clientCapabilities: {},
    clientInfo: { name: "maple-acp-http-interop", version: "1" },
  });
  report.protocolVersion = init.protocolVersion;
  sid = (await ctx.request(acp.methods.agent.session.new, { cwd: project, mcpServers: [] }))
    .sessionId;
  const prompt = (text) => ctx.request(acp.methods.agent.session.prompt, {
    sessionId: sid, prompt: [{ type: "text", text }],
  });
  const streamed = await prompt("/stream 20 50");
  await until(() => first.text(sid).length >= 1000);
  report.streamed = first.text(sid).length;
  report.streamStop = streamed.stopReason;
  const allowed = await prompt(`/tool shell {"command": "touch allowed-marker"}`);
  const denied = await prompt(`/tool shell {"command": "touch denied-marker"}`);
  report.permissions = first.asked;
  report.permissionStops = [allowed.stopReason, denied.stopReason];
  const hang = prompt("/hang");
  await new Promise((resolve) => setTimeout(resolve, 200));
  await ctx.notify(acp.methods.agent.session.cancel, { sessionId: sid });
  report.cancelStop = (await hang).stopReason;
  const listed = await ctx.request(acp.methods.agent.session.list, { cwd: project });
  report.listed = listed.sessions.map((s) => s.sessionId).includes(sid);
});

const again = recorder([]);
await again.app.connectWith(open(), async (ctx) => {
  await ctx.request(acp.methods.agent.initialize, {
    protocolVersion: 1, clientCapabilities: {},
  });
  await ctx.request(acp.methods.agent.session.load, {
    sessionId: sid, cwd: project, mcpServers: [],
  });
  await until(() => again.text(sid, "user_message_chunk").includes("/stream 20 50"));
  await until(() => again.text(sid).length >= 1000);
  report.replayedText = again.text(sid).length;
  report.replayedKinds = [...new Set(again.updates.filter((u) => u.sessionId === sid)
    .map((u) => u.update.sessionUpdate))].sort();
  const resumed = await ctx.request(acp.methods.agent.session.resume, {
    sessionId: sid, cwd: project, mcpServers: [],
  });
  report.resumedModes = resumed.modes != null;
  await ctx.request(acp.methods.agent.session.close, { sessionId: sid });
  const listed = await ctx.request(acp.methods.agent.session.list, { cwd: project });
  report.listedAfterClose = listed.sessions.map((s) => s.sessionId).includes(sid);
});
console.log(JSON.stringify(report));
