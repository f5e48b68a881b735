// Drives `maple-acp acp` (argv: command..., then the project directory last) with the
// TypeScript SDK's experimental ACP v2 client: initialize, a streamed prompt, a tool
// allowed, a delegation to a child session, a resume that replays, close. Prints one JSON line of what it saw; exits non-zero
// on any failure (the SDK itself checks every frame it receives).
import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";
import * as acp from "@agentclientprotocol/sdk/experimental/v2";
import { allowOnce, openSession, updateLog } from "./v2_kit.mjs";

const args = process.argv.slice(2);
const project = args.pop();
const child = spawn(args[0], args.slice(1), { stdio: ["pipe", "pipe", "inherit"] });
const stream = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));

const { updates, add, until } = updateLog();
const idles = (sid) =>
  updates.filter((u) => u.sessionId === sid && u.update.sessionUpdate === "state_update" &&
    u.update.state === "idle").length;
const text = (sid, kind) =>
  updates.filter((u) => u.sessionId === sid && u.update.sessionUpdate === kind)
    .map((u) => u.update.content.text).join("");

const permissions = [];
const askedFor = [];
const app = acp.client({ name: "maple-acp-v2-interop" })
  .onNotification(acp.methods.client.session.update, ({ params }) => {
    add(params);
  })
  .onRequest(acp.methods.client.session.requestPermission, ({ params }) => {
    permissions.push({ title: params.title, subject: params.subject?.type });
    askedFor.push(params.sessionId);
    return allowOnce(params);
  });

const report = {};
await app.connectWith(stream, async (ctx) => {
  const { protocolVersion, sid } = await openSession(ctx, "maple-acp-v2-interop", project);
  report.protocolVersion = protocolVersion;
  const answer = await ctx.request(acp.methods.agent.session.prompt, {
    sessionId: sid,
    prompt: [{ type: "text", text: "/stream 20 50" }],
  });
  report.messageId = answer.messageId;
  await until(() => idles(sid) >= 1);
  report.streamed = text(sid, "agent_message_chunk").length;
  await ctx.request(acp.methods.agent.session.prompt, {
    sessionId: sid,
    prompt: [{ type: "text", text: `/tool shell {"command": "touch interop-marker"}` }],
  });
  await until(() => idles(sid) >= 2);
  report.permissions = [...permissions];
  report.states = updates.filter((u) => u.update.sessionUpdate === "state_update")
    .map((u) => u.update.state + (u.update.stopReason ? ":" + u.update.stopReason : ""));
  report.toolKinds = [...new Set(updates.filter((u) => u.update.toolCallId)
    .map((u) => u.update.sessionUpdate))];
  // A child session: announced on the parent, its own updates under its id, its permission
  // question asked with its id, the delegation and the answer as session messages.
  await ctx.request(acp.methods.agent.session.prompt, {
    sessionId: sid,
    prompt: [{ type: "text", text: "/delegate Survey :: list the files" }],
  });
  await until(() => idles(sid) >= 3);
  const announced = updates.find((u) => u.sessionId === sid &&
    u.update.sessionUpdate === "subagent_update");
  const childId = announced?.update.sessionId;
  report.child = {
    title: announced?.update.title,
    text: text(childId, "agent_message_chunk"),
    askedWithItsId: askedFor.slice(-1)[0] === childId,
    messages: updates.filter((u) => u.sessionId === sid &&
      u.update.sessionUpdate === "session_message")
      .map((u) => [u.update.senderSessionId === sid ? "parent" : "child", u.update.content[0].text]),
  };
  await ctx.request(acp.methods.agent.session.close, { sessionId: sid });
  const before = updates.length;
  await ctx.request(acp.methods.agent.session.resume, {
    sessionId: sid, cwd: project, mcpServers: [], replayFrom: { type: "start" },
  });
  // A replay sends each message whole (its content replaces what the client holds).
  report.replayed = updates.slice(before).filter((u) => u.sessionId === sid &&
    u.update.sessionUpdate === "user_message" && u.update.content.length === 1).length;
  // The child's transcript is replayed under its own id, its prompt whole.
  report.child.replayed = updates.slice(before).filter((u) => u.sessionId === childId &&
    u.update.sessionUpdate === "user_message").length;
  const listed = await ctx.request(acp.methods.agent.session.list, {});
  report.listed = listed.sessions.map((s) => s.sessionId).includes(sid);
});
child.stdin.end();
console.log(JSON.stringify(report));
