// What the v2 client scripts share: the session updates received and a way to wait for one,
// the answer that allows a tool once, and opening a connection's session.
import * as acp from "@agentclientprotocol/sdk/experimental/v2";

// `until` resolves once `test()` holds (checked at each update), or rejects after 20 s.
export function updateLog() {
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
  return {
    updates,
    add(update) {
      updates.push(update);
      seen();
    },
    until(test) {
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error("timed out waiting")), 20000);
        waiters.push({ test, resolve: () => { clearTimeout(timer); resolve(); } });
        seen();
      });
    },
  };
}

export function allowOnce(params) {
  const allow = params.options.find((o) => o.kind === "allow_once");
  return { outcome: { outcome: "selected", optionId: allow.optionId } };
}

// initialize (asking for v2) and session/new in `project`: the protocol version and the id.
export async function openSession(ctx, name, project) {
  const init = await ctx.request(acp.methods.agent.initialize, {
    protocolVersion: 2,
    info: { name, version: "1" },
    capabilities: {},
  });
  const created = await ctx.request(acp.methods.agent.session.new,
    { cwd: project, mcpServers: [] });
  return { protocolVersion: init.protocolVersion, sid: created.sessionId };
}
