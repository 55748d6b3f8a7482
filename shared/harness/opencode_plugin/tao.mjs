// Generated from tao.ts (the source: read and edit that file), for Node versions that cannot
// strip TypeScript types; regenerate with the command in docs/harnesses.md ("The OpenCode plugin").
// Do not edit by hand: a test compares the string literals of both files.
const DEFAULT_GATEWAY = "http://127.0.0.1:8000";
const DEFAULT_TIMEOUT_MS = 2000;
const MAX_WAITING = 1000;
const TAIL_CHARS = 2048;
const MAX_PARTS = 10000;
function setting(name) {
    try {
        const value = process.env[name];
        return value ? value : undefined;
    }
    catch {
        return undefined;
    }
}
function record(value) {
    return value !== null && typeof value === "object" && !Array.isArray(value)
        ? value
        : undefined;
}
function tail(value) {
    return typeof value === "string" ? value.slice(-TAIL_CHARS) : undefined;
}
/** Tool arguments cut to what TAO reads: the bash `timeout` (ms). */
function args(value) {
    const timeout = record(value)?.timeout;
    return typeof timeout === "number" ? { timeout } : {};
}
function ids(input) {
    const m = record(input) ?? {};
    return { tool: m.tool, sessionID: m.sessionID, callID: m.callID };
}
/** A tool part cut to what TAO reads; undefined when its status is not new or not wanted. */
function toolPart(part, seen) {
    const state = record(part.state) ?? {};
    const status = state.status;
    if (status !== "running" && status !== "completed" && status !== "error")
        return undefined;
    const key = String(part.id ?? part.callID);
    if (seen.get(key) === status)
        return undefined;
    if (status === "running") {
        if (seen.size >= MAX_PARTS)
            seen.clear();
        seen.set(key, status);
    }
    else {
        seen.delete(key);
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
    };
}
/** The event to forward, cut to what TAO reads; undefined for events TAO does not use. */
function eventBody(event, seen) {
    const e = record(event) ?? {};
    const type = e.type;
    const props = record(e.properties) ?? {};
    if (type === "session.idle")
        return { type, properties: { sessionID: props.sessionID } };
    if (type === "session.deleted") {
        return { type, properties: { info: { id: record(props.info)?.id } } };
    }
    if (type !== "message.part.updated")
        return undefined;
    const part = record(props.part);
    if (part === undefined || part.type !== "tool")
        return undefined;
    const cut = toolPart(part, seen);
    return cut === undefined ? undefined : { type, properties: { part: cut } };
}
export const TaoPlugin = async () => {
    const base = (setting("TAO_GATEWAY_URL") ?? DEFAULT_GATEWAY).replace(/\/+$/, "");
    const url = `${base}/hooks/opencode`;
    const timeoutMs = Number(setting("TAO_HOOK_TIMEOUT_MS")) || DEFAULT_TIMEOUT_MS;
    const seen = new Map();
    let chain = Promise.resolve();
    let waiting = 0;
    const post = async (body) => {
        try {
            const res = await fetch(url, {
                method: "POST",
                headers: { "content-type": "application/json" },
                body: JSON.stringify(body),
                signal: AbortSignal.timeout(timeoutMs),
            });
            await res.body?.cancel();
        }
        catch {
            // best effort: TAO's faults never reach the agent
        }
    };
    const send = (hook, fields) => {
        if (waiting >= MAX_WAITING)
            return;
        waiting += 1;
        const body = { hook, ts: Date.now(), ...fields };
        chain = chain
            .then(() => post(body))
            .then(() => {
            waiting -= 1;
        });
    };
    return {
        "tool.execute.before": async (input, output) => {
            try {
                send("tool.execute.before", {
                    input: ids(input),
                    output: { args: args(record(output)?.args) },
                });
            }
            catch {
                // never disturb the agent
            }
        },
        "tool.execute.after": async (input, output) => {
            try {
                const out = record(output) ?? {};
                const exit = record(out.metadata)?.exit;
                send("tool.execute.after", {
                    input: ids(input),
                    output: { output: tail(out.output), metadata: { exit: exit ?? null } },
                });
            }
            catch {
                // never disturb the agent
            }
        },
        event: async (input) => {
            try {
                const body = eventBody(record(input)?.event, seen);
                if (body !== undefined)
                    send("event", { event: body });
            }
            catch {
                // never disturb the agent
            }
        },
        "chat.message": async (input) => {
            try {
                send("chat.message", { input: { sessionID: record(input)?.sessionID } });
            }
            catch {
                // never disturb the agent
            }
        },
        "chat.headers": async (input, output) => {
            try {
                const sid = record(input)?.sessionID;
                const headers = record(record(output)?.headers);
                if (typeof sid === "string" && headers !== undefined) {
                    headers["X-Session-ID"] = sid;
                    headers["X-TAO-Harness"] = "opencode";
                }
            }
            catch {
                // never disturb the agent
            }
        },
    };
};
