// Behaviour check of TAO's OpenCode plugin, run by test_opencode_plugin.py:
//   node opencode_plugin_check.mjs PLUGIN_FILE
// Loads the plugin against a local HTTP server standing in for the gateway, drives its hooks as
// OpenCode would, and asserts what was posted and that no hook waited for the network. Prints
// the posted bodies as one JSON array on stdout (the Python side maps them); exits 1 on failure.
import assert from "node:assert/strict"
import http from "node:http"
import { pathToFileURL } from "node:url"

const file = process.argv[2]
let unhandled = 0
process.on("unhandledRejection", () => {
  unhandled += 1
})

/** A gateway stand-in: records bodies; holds responses while `holding`; `drop` kills sockets. */
function gateway() {
  const g = { bodies: [], paths: [], held: [], holding: false, drop: false, waiters: [] }
  g.server = http.createServer((req, res) => {
    let data = ""
    req.on("data", (chunk) => {
      data += chunk
    })
    req.on("end", () => {
      g.paths.push(`${req.method} ${req.url} ${req.headers["content-type"]}`)
      g.bodies.push(JSON.parse(data))
      for (const wake of g.waiters.splice(0)) wake()
      if (g.drop) req.socket.destroy()
      else if (g.holding) g.held.push(res)
      else res.end()
    })
  })
  g.received = (n) =>
    new Promise((resolve) => {
      const check = () => (g.bodies.length >= n ? resolve() : g.waiters.push(check))
      check()
    })
  g.release = () => {
    g.holding = false
    for (const res of g.held.splice(0)) res.end()
  }
  return new Promise((resolve) => {
    g.server.listen(0, "127.0.0.1", () => resolve(g))
  })
}

const turn = () => new Promise((resolve) => setImmediate(resolve))

async function load(env) {
  Object.assign(process.env, env)
  const mod = await import(`${pathToFileURL(file).href}?${Math.random()}`)
  assert.deepEqual(Object.keys(mod), ["TaoPlugin"], "OpenCode calls every export as a plugin")
  return mod.TaoPlugin({})
}

const part = (status, extra) => ({
  type: "message.part.updated",
  properties: {
    part: {
      id: "prt_1",
      sessionID: "ses_7f3a",
      messageID: "msg_9",
      type: "tool",
      callID: "toolu_01XYZ",
      tool: "bash",
      state: { status, input: { command: "npm test", timeout: 300000 }, ...extra },
    },
  },
})
const big = "x".repeat(5000)
const marker = "\n\n<bash_metadata>\nbash tool terminated command after exceeding timeout 300000 ms\n</bash_metadata>"

async function main() {
  const g = await gateway()
  const hooks = await load({ TAO_GATEWAY_URL: `http://127.0.0.1:${g.server.address().port}/` })

  // 1. Hooks return while the gateway still holds the first request, and later hooks do not
  //    wait behind it either: they only queue.
  g.holding = true
  const ids = { tool: "bash", sessionID: "ses_7f3a", callID: "toolu_01XYZ" }
  let settled = false
  const first = hooks.event({ event: part("running", { time: { start: 1767225600000 } }) })
  first.then(() => {
    settled = true
  })
  await g.received(1)
  await turn()
  assert.equal(settled, true, "the event hook waited for the network")
  assert.equal(g.held.length, 1, "the first request is still held")
  await Promise.all([
    hooks.event({ event: part("running", { time: { start: 1767225600000 }, metadata: { output: "." } }) }),
    hooks["tool.execute.before"](ids, { args: { command: "npm test", timeout: 300000, description: "d" } }),
    hooks["tool.execute.after"]({ ...ids, args: {} }, { title: "t", output: big + marker, metadata: { exit: null, output: big } }),
    hooks.event({ event: { type: "message.part.updated", properties: { part: { type: "text", text: "hi" } } } }),
    hooks.event({ event: { type: "message.updated", properties: {} } }),
    hooks.event({ event: part("completed", { output: big + marker, title: "t", metadata: {}, time: { start: 1767225600000, end: 1767225608421 } }) }),
    hooks.event({ event: { type: "session.idle", properties: { sessionID: "ses_7f3a" } } }),
    hooks["chat.message"]({ sessionID: "ses_7f3a", agent: "build" }, { message: {}, parts: [] }),
    hooks.event({ event: { type: "session.deleted", properties: { info: { id: "ses_7f3a", title: "x" } } } }),
  ])
  assert.equal(g.bodies.length, 1, "queued sends went out while the first was held")
  g.release()
  await g.received(7)
  await turn()
  assert.equal(g.bodies.length, 7, "unwanted events and repeated statuses are not sent")
  for (const p of g.paths) assert.equal(p, "POST /hooks/opencode application/json")
  const kinds = g.bodies.map((b) => (b.hook === "event" ? b.event.type + ":" + (b.event.properties.part?.state.status ?? "") : b.hook))
  assert.deepEqual(kinds, [
    "message.part.updated:running",
    "tool.execute.before",
    "tool.execute.after",
    "message.part.updated:completed",
    "session.idle:",
    "chat.message",
    "session.deleted:",
  ])
  for (const b of g.bodies) assert.equal(typeof b.ts, "number")
  assert.deepEqual(g.bodies[1].output, { args: { timeout: 300000 } }, "args cut to the timeout")
  assert.deepEqual(g.bodies[1].input, ids)
  const after = g.bodies[2].output
  assert.equal(after.output.length, 2048)
  assert.ok(after.output.endsWith("</bash_metadata>"), "the marker survives the cut")
  assert.deepEqual(after.metadata, { exit: null })
  const done = g.bodies[3].event.properties.part
  assert.deepEqual(done.state.time, { start: 1767225600000, end: 1767225608421 })
  assert.deepEqual(done.state.input, { timeout: 300000 })
  assert.equal(done.state.output.length, 2048)
  assert.deepEqual(g.bodies[6].event.properties, { info: { id: "ses_7f3a" } })

  // 2. chat.headers names the session for the gateway.
  const headers = { Authorization: "k" }
  await hooks["chat.headers"]({ sessionID: "ses_7f3a" }, { headers })
  assert.deepEqual(headers, { Authorization: "k", "X-Session-ID": "ses_7f3a", "X-TAO-Harness": "opencode" })

  // 3. Malformed hook arguments never throw into OpenCode.
  await hooks["tool.execute.before"](undefined, undefined)
  await hooks["tool.execute.after"](null, null)
  await hooks.event(undefined)
  await hooks["chat.headers"](undefined, undefined)
  await hooks["chat.message"](undefined, undefined)

  const bodies = g.bodies.slice(0, 7)
  await g.received(10)
  g.server.close()

  // 4. A gateway that drops the connection, then one that never answers (cut by the timeout):
  //    the failures are swallowed and later payloads still go out, in order.
  const d = await gateway()
  const flaky = await load({
    TAO_GATEWAY_URL: `http://127.0.0.1:${d.server.address().port}`,
    TAO_HOOK_TIMEOUT_MS: "50",
  })
  d.drop = true
  await flaky["chat.message"]({ sessionID: "a" })
  await d.received(1)
  d.drop = false
  d.holding = true
  await flaky["chat.message"]({ sessionID: "b" })
  await flaky["chat.message"]({ sessionID: "c" })
  await d.received(3)
  assert.deepEqual(d.bodies.map((b) => b.input.sessionID), ["a", "b", "c"])
  d.release()
  d.server.close()
  await turn()
  assert.equal(unhandled, 0, "no unhandled rejection")
  process.stdout.write(JSON.stringify(bodies))
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err?.stack ?? String(err))
    process.exit(1)
  },
)
