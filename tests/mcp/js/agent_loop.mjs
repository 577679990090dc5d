// The agent loop through a TypeScript SDK client: create, claim, heartbeat
// with progress, ask, answer, claim again, complete. SDK=v2 (@modelcontextprotocol/client, 2026-07-28)
// or SDK=v1 (@modelcontextprotocol/sdk, 2025-11-25). Prints one JSON line.
const url = new URL(process.env.MCP_URL);
const requestInit = { headers: { Authorization: `Bearer ${process.env.TOKEN}` } };
const info = { name: `ts-sdk-${process.env.SDK}`, version: "1.0.0" };

async function connect() {
  if (process.env.SDK === "v2") {
    const { Client, StreamableHTTPClientTransport } = await import("@modelcontextprotocol/client");
    // The v2 client probes server/discover (and so speaks 2026-07-28) in "auto"
    // mode; its default is still the legacy handshake.
    const client = new Client(info, { versionNegotiation: { mode: "auto" } });
    await client.connect(new StreamableHTTPClientTransport(url, { requestInit }));
    return client;
  }
  const { Client } = await import("@modelcontextprotocol/sdk/client/index.js");
  const { StreamableHTTPClientTransport } = await import(
    "@modelcontextprotocol/sdk/client/streamableHttp.js"
  );
  const client = new Client(info);
  await client.connect(new StreamableHTTPClientTransport(url, { requestInit }));
  return client;
}

const client = await connect();
const call = async (name, args) => (await client.callTool({ name, arguments: args })).structuredContent;
const tools = (await client.listTools()).tools.map((tool) => tool.name);
const created = await call("create_todo", { queue: "ts", title: "from TypeScript" });
const id = created.todo.id;
const claimed = await call("claim_next", { queue: "ts" });
const beat = await call("heartbeat", {
  todo_id: id,
  lease_token: claimed.todo.lease_token,
  progress: { message: "half way" },
});
const asked = await call("ask", {
  todo_id: id,
  lease_token: claimed.todo.lease_token,
  question: "Go?",
  choices: ["go"],
});
await call("answer", { todo_id: id, answer: "go" });
const again = await call("claim_next", { queue: "ts" });
const done = await call("complete_todo", {
  todo_id: id,
  lease_token: again.todo.lease_token,
  result: { by: info.name },
});
const version =
  client.getNegotiatedProtocolVersion?.() ?? client.transport?.protocolVersion ?? null;
console.log(
  JSON.stringify({
    version,
    tools: tools.includes("claim_next"),
    claimedId: claimed.todo.id,
    owner: claimed.todo.owner,
    progress: beat.todo.progress.message,
    asked: asked.todo.outcome,
    answer: again.todo.answer.value,
    state: done.todo.state,
    result: done.todo.result,
  }),
);
await client.close();
