/**
 * TAO plugin for OpenCode: reports tool-call timings to the TAO gateway.
 *
 * `tao hooks install opencode` copies this file to `.opencode/plugins/tao.ts` (project) or
 * `~/.config/opencode/plugins/tao.ts` (user): OpenCode loads every .ts and .js file of those
 * directories (opencode.ai/docs/plugins, "Discover") and calls each export as a plugin, so
 * this module exports the plugin and nothing else.
 *
 * What it sends, one JSON object per POST to `$TAO_GATEWAY_URL/hooks/opencode`
 * (http://127.0.0.1:8000 by default); shared/harness/opencode.py documents the payloads and
 * maps them to TAO's tool events:
 *   - tool.execute.before / tool.execute.after (ids, the `timeout` argument, the output's
 *     last 2 KiB, where OpenCode's bash timeout marker is);
 *   - event: `message.part.updated` for tool parts, once per status change (OpenCode's own
 *     `state.time.start/end`), `session.idle`, `session.deleted`;
 *   - chat.message: the user answered.
 * Each carries `ts`, the time the hook ran (epoch ms). The `chat.headers` hook also sets
 * `X-Session-ID` (the OpenCode session id) and `X-TAO-Harness: opencode` on model requests,
 * so a gateway in front of the model sees OpenCode's session.
 *
 * It never slows the agent: a hook only queues its payload and returns. The queue goes out one
 * request at a time, in order (the mapper relies on it), each cut after $TAO_HOOK_TIMEOUT_MS
 * (2000 ms); past 1000 waiting payloads new ones are dropped; every error is swallowed.
 *
 * Written in erasable TypeScript only (Bun runs it, and so does `node
 * --experimental-strip-types`); tao.mjs beside it is the same code compiled, for Node
 * versions that cannot strip types (regenerate: see docs/harnesses.md).
 */
import type { Plugin } from "@opencode-ai/plugin"

type Json = { [key: string]: unknown }

const DEFAULT_GATEWAY = "http://127.0.0.1:8000"
const DEFAULT_TIMEOUT_MS = 2000
const MAX_WAITING = 1000
const TAIL_CHARS = 2048
const MAX_PARTS = 10000

function setting(name: string): string | undefined {
  try {
    const value = process.env[name]
    return value ? value : undefined
  } catch {
    return undefined
  }
}

function record(value: unknown): Json | undefined {
  return value !== null && typeof value === "object" && !Array.isArray(value)
    ? (value as Json)
    : undefined
}

function tail(value: unknown): string | undefined {
  return typeof value === "string" ? value.slice(-TAIL_CHARS) : undefined
}

/** Tool arguments cut to what TAO reads: the bash `timeout` (ms). */
function args(value: unknown): Json {
  const timeout = record(value)?.timeout
  return typeof timeout === "number" ? { timeout } : {}
}

function ids(input: unknown): Json {
  const m = record(input) ?? {}
  return { tool: m.tool, sessionID: m.sessionID, callID: m.callID }
}

/** A tool part cut to what TAO reads; undefined when its status is not new or not wanted. */
function toolPart(part: Json, seen: Map<string, string>): Json | undefined {
  const state = record(part.state) ?? {}
  const status = state.status
  if (status !== "running" && status !== "completed" && status !== "error") return undefined
  const key = String(part.id ?? part.callID)
  if (seen.get(key) === status) return undefined
  if (status === "running") {
    if (seen.size >= MAX_PARTS) seen.clear()
    seen.set(key, status)
  } else {
    seen.delete(key)
  }
  return {
    id: part.id,
    sessionID: part.sessionID,
    messageID: part.messageID,
    type: "tool",
    callID: part.callID,
    tool: part.tool,
    state: {
      status,
      time: state.time,
      input: args(state.input),
      output: tail(state.output),
      error: tail(state.error),
    },
  }
}

/** The event to forward, cut to what TAO reads; undefined for events TAO does not use. */
function eventBody(event: unknown, seen: Map<string, string>): Json | undefined {
  const e = record(event) ?? {}
  const type = e.type
  const props = record(e.properties) ?? {}
  if (type === "session.idle") return { type, properties: { sessionID: props.sessionID } }
  if (type === "session.deleted") {
    return { type, properties: { info: { id: record(props.info)?.id } } }
  }
  if (type !== "message.part.updated") return undefined
  const part = record(props.part)
  if (part === undefined || part.type !== "tool") return undefined
  const cut = toolPart(part, seen)
  return cut === undefined ? undefined : { type, properties: { part: cut } }
}

export const TaoPlugin: Plugin = async () => {
  const base = (setting("TAO_GATEWAY_URL") ?? DEFAULT_GATEWAY).replace(/\/+$/, "")
  const url = `${base}/hooks/opencode`
  const timeoutMs = Number(setting("TAO_HOOK_TIMEOUT_MS")) || DEFAULT_TIMEOUT_MS
  const seen = new Map<string, string>()
  let chain: Promise<void> = Promise.resolve()
  let waiting = 0

  const post = async (body: Json): Promise<void> => {
    try {
      const res = await fetch(url, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(body),
        signal: AbortSignal.timeout(timeoutMs),
      })
      await res.body?.cancel()
    } catch {
      // best effort: TAO's faults never reach the agent
    }
  }

  const send = (hook: string, fields: Json): void => {
    if (waiting >= MAX_WAITING) return
    waiting += 1
    const body = { hook, ts: Date.now(), ...fields }
    chain = chain
      .then(() => post(body))
      .then(() => {
        waiting -= 1
      })
  }

  return {
    "tool.execute.before": async (input, output) => {
      try {
        send("tool.execute.before", {
          input: ids(input),
          output: { args: args(record(output)?.args) },
        })
      } catch {
        // never disturb the agent
      }
    },
    "tool.execute.after": async (input, output) => {
      try {
        const out = record(output) ?? {}
        const exit = record(out.metadata)?.exit
        send("tool.execute.after", {
          input: ids(input),
          output: { output: tail(out.output), metadata: { exit: exit ?? null } },
        })
      } catch {
        // never disturb the agent
      }
    },
    event: async (input) => {
      try {
        const body = eventBody(record(input)?.event, seen)
        if (body !== undefined) send("event", { event: body })
      } catch {
        // never disturb the agent
      }
    },
    "chat.message": async (input) => {
      try {
        send("chat.message", { input: { sessionID: record(input)?.sessionID } })
      } catch {
        // never disturb the agent
      }
    },
    "chat.headers": async (input, output) => {
      try {
        const sid = record(input)?.sessionID
        const headers = record(record(output)?.headers)
        if (typeof sid === "string" && headers !== undefined) {
          headers["X-Session-ID"] = sid
          headers["X-TAO-Harness"] = "opencode"
        }
      } catch {
        // never disturb the agent
      }
    },
  }
}
