-- Write one folded batch of session updates (Store.update_sessions_with, shared/infra/store.py).
-- Runs inside MULTI/EXEC under WATCH of every session hash, so it lands only if none moved.
--
-- KEYS[1] sessions set, KEYS[2] pool set, KEYS[3] admitted_tool set, then the session hashes,
-- then the node hashes. ARGV[1] JSON {"s": [[key index, raw id, new 0/1, pooled, in tool,
-- field, value, field, value, ...], ...], "r": [[key index, reserved delta], ...]}.
-- `new` 1: the record did not exist (SADD to the sessions set). `pooled` / `in tool`: 1 add
-- to the index set, 0 remove from it, -1 membership unchanged (Python compared the stored
-- record with the new one under the WATCH). Only changed fields are sent. Every value is a
-- string written as given (floats are never formatted here); the deltas are integer strings
-- added with HINCRBY (0 included: the node hash then exists, as after the single updates).
local batch = cjson.decode(ARGV[1])
for _, w in ipairs(batch.s) do
  local key, sid = KEYS[w[1]], w[2]
  if #w > 5 then
    redis.call('HSET', key, unpack(w, 6))
  end
  if w[3] == 1 then
    redis.call('SADD', KEYS[1], sid)
  end
  if w[4] == 1 then
    redis.call('SADD', KEYS[2], sid)
  elseif w[4] == 0 then
    redis.call('SREM', KEYS[2], sid)
  end
  if w[5] == 1 then
    redis.call('SADD', KEYS[3], sid)
  elseif w[5] == 0 then
    redis.call('SREM', KEYS[3], sid)
  end
end
for _, r in ipairs(batch.r) do
  redis.call('HINCRBY', KEYS[r[1]], 'reserved', r[2])
end
return #batch.s
