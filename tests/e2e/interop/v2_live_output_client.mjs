// Drives `maple-acp acp` (argv: command..., then the project directory last) with the
// TypeScript SDK's experimental ACP v2 client through a command's live output: a shell
// command printing a line every quarter second, a failing one, one printing more at once
// than the tail holds, a background one followed to its end, and a Markdown plan. Prints one
// JSON line: what it saw, with every frame that crossed the pipe (raw, both ways) for the
// caller to check against the schema. Exits non-zero on any failure; the SDK parses every
// frame it receives.
import { spawn } from "node:child_process";
import { PassThrough, Readable, Writable } from "node:stream";
import { isDeepStrictEqual } from "node:util";
import * as acp from "@agentclientprotocol/sdk/experimental/v2";
import { allowOnce, openSession, updateLog } from "./v2_kit.mjs";

const args = process.argv.slice(2);
const project = args.pop();
const child = spawn(args[0], args.slice(1), { stdio: ["pipe", "pipe", "inherit"] });

// Every line both ways, as sent, before the SDK sees it.
const frames = [];
function tap(direction) {
  let rest = "";
  return (chunk) => {
    const lines = (rest + chunk.toString("utf8")).split("\n");
    rest = lines.pop();
    for (const line of lines) {
      if (line.trim()) frames.push([direction, JSON.parse(line)]);
    }
  };
}
child.stdout.on("data", tap("in"));
const outbound = new PassThrough();
outbound.on("data", tap("out"));
outbound.pipe(child.stdin);
const stream = acp.ndJsonStream(Writable.toWeb(outbound), Readable.toWeb(child.stdout));

const started = Date.now();
const { updates, add, until } = updateLog();
const of = (sid, kinds) =>
  updates.filter((u) => u.sessionId === sid && kinds.includes(u.update.sessionUpdate));
const idles = (sid) => of(sid, ["state_update"]).filter((u) => u.update.state === "idle").length;
const decode = (data) => Buffer.from(data, "base64").toString("utf8");

// What one tool call's terminal showed: its frames in arrival order, each with its time.
function terminal(sid, toolCallId) {
  const shown = of(sid, ["terminal_update", "terminal_output_chunk"])
    .filter((u) => u.update.terminalId === toolCallId);
  const rows = of(sid, ["tool_call_update"]).filter((u) => u.update.toolCallId === toolCallId);
  return {
    kinds: shown.map((u) => u.update.sessionUpdate),
    chunks: shown.filter((u) => u.update.sessionUpdate === "terminal_output_chunk")
      .map((u) => decode(u.update.data)),
    chunkTimes: shown.filter((u) => u.update.sessionUpdate === "terminal_output_chunk")
      .map((u) => u.at),
    opened: shown[0]?.update,
    exitStatus: shown.at(-1)?.update.exitStatus ?? null,
    exitAt: shown.at(-1)?.at,
    // Where the call first shows its terminal, counted among the session's updates.
    shownAt: updates.findIndex((u) => u.update.toolCallId === toolCallId &&
      (u.update.content ?? []).some((c) => c.type === "terminal" && c.terminalId === toolCallId)),
    openedAt: updates.indexOf(shown[0]),
    firstChunkAt: updates.indexOf(shown.find((u) => u.update.sessionUpdate === "terminal_output_chunk")),
    // What a client shows: a replacement `output` resets the terminal, a chunk appends.
    shown: shown.reduce((text, u) => u.update.sessionUpdate === "terminal_output_chunk"
      ? text + decode(u.update.data)
      : u.update.output ? decode(u.update.output.data) : text, ""),
    replaced: shown.filter((u) => u.update.output).length,
    statuses: rows.map((u) => u.update.status).filter((s) => s),
    lastContent: rows.at(-1)?.update.content ?? null,
  };
}
const shellCalls = (sid) => [...new Set(of(sid, ["tool_call_update"])
  .filter((u) => u.update.name === "shell").map((u) => u.update.toolCallId))];

const app = acp.client({ name: "maple-acp-v2-live-output" })
  .onNotification(acp.methods.client.session.update, ({ params }) => {
    add({ ...params, at: Date.now() - started });
  })
  .onRequest(acp.methods.client.session.requestPermission, ({ params }) => allowOnce(params));

const report = {};
await app.connectWith(stream, async (ctx) => {
  const { protocolVersion, sid } = await openSession(ctx, "maple-acp-v2-live-output", project);
  report.protocolVersion = protocolVersion;
  const prompt = (text) => ctx.request(acp.methods.agent.session.prompt,
    { sessionId: sid, prompt: [{ type: "text", text }] });

  const command = "for i in 1 2 3; do echo line$i; sleep 0.25; done";
  await prompt(`/tool shell ${JSON.stringify({ command })}`);
  await until(() => idles(sid) >= 1);
  report.live = terminal(sid, shellCalls(sid)[0]);

  await prompt(`/tool shell ${JSON.stringify({ command: "echo oops; exit 3" })}`);
  await until(() => idles(sid) >= 2);
  report.failing = terminal(sid, shellCalls(sid)[1]);

  // More at once than the tail holds: the terminal's output is replaced, then goes on.
  const flood = "head -c 100000 /dev/zero | tr '\\0' x; echo; sleep 0.2; echo end";
  await prompt(`/tool shell ${JSON.stringify({ command: flood })}`);
  await until(() => idles(sid) >= 3);
  const big = terminal(sid, shellCalls(sid)[2]);
  report.flood = { shownLength: big.shown.length, replaced: big.replaced,
    shownEnd: big.shown.slice(-6), allX: /^x+$/.test(big.shown.slice(0, -5)),
    exitStatus: big.exitStatus, kinds: big.kinds.length };

  await prompt("/bg echo bg1; sleep 0.5; echo bg2");
  await until(() => idles(sid) >= 4);
  const bg = shellCalls(sid)[3];
  report.bgText = of(sid, ["agent_message_chunk"]).map((u) => u.update.content.text).at(-1);
  report.bgAtTurnEnd = terminal(sid, bg).statuses.at(-1);
  await until(() => terminal(sid, bg).statuses.at(-1) === "completed");
  report.background = terminal(sid, bg);
  report.backgroundList = await ctx.request("_session/background",
    { sessionId: sid, action: "list" });

  await prompt("/plan-md # Steps\\n- [x] build\\n- [ ] ship");
  await until(() => idles(sid) >= 5);
  report.plans = of(sid, ["plan_update"]).map((u) => u.update.plan);

  // The SDK's own parse (zod) of each terminal and plan update is what the handler got: a
  // field its lenient parse had to drop or default would differ from what was sent.
  const raw = frames.filter(([d, m]) => d === "in" && m.method === "session/update")
    .map(([, m]) => m.params);
  const checked = ["terminal_update", "terminal_output_chunk", "plan_update"];
  report.sdkParsed = 0;
  report.sdkAltered = [];
  raw.forEach((params, i) => {
    if (!checked.includes(params.update.sessionUpdate)) return;
    report.sdkParsed += 1;
    const { at, ...parsed } = updates[i];
    if (!isDeepStrictEqual(JSON.parse(JSON.stringify(parsed)), params)) {
      report.sdkAltered.push({ sent: params, parsed });
    }
  });
  await ctx.request(acp.methods.agent.session.close, { sessionId: sid });
});
outbound.end();
report.frames = frames;
console.log(JSON.stringify(report));
