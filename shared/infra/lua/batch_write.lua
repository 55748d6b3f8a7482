-- Write one folded batch of session updates (Store.update_sessions_with, shared/infra/store.py).
-- Runs inside MULTI/EXEC under WATCH of every session hash, so it lands only if none moved.
--
-- KEYS[1] sessions set, KEYS[2] pool set, KEYS[3] admitted_tool set, then the session hashes,
-- then the node hashes. ARGV[1] JSON {"s": [[key index, raw id, pooled 0/1, in tool 0/1,
-- field, value, field, value, ...], ...], "r": [[key index, reserved delta], ...]}.
-- Every value is a string written as given (floats are never formatted here); the deltas are
-- integer strings added with HINCRBY (0 included: the node hash then exists, as after the
-- single updates' -w/+w).
local batch = cjson.decode(ARGV[1])
for _, w in ipairs(batch.s) do
  local key, sid = KEYS[w[1]], w[2]
  if #w > 4 then
    redis.call('HSET', key, unpack(w, 5))
  end
  redis.call('SADD', KEYS[1], sid)
  if w[3] == 1 then
    redis.call('SADD', KEYS[2], sid)
  else
    redis.call('SREM', KEYS[2], sid)
  end
  if w[4] == 1 then
    redis.call('SADD', KEYS[3], sid)
  else
    redis.call('SREM', KEYS[3], sid)
  end
end
for _, r in ipairs(batch.r) do
  redis.call('HINCRBY', KEYS[r[1]], 'reserved', r[2])
end
return #batch.s
