-- Check, then write one folded batch of session updates and tool samples
-- (Store.update_sessions_with, shared/infra/store.py). One command: no WATCH, no MULTI/EXEC.
--
-- KEYS[1] sessions set, KEYS[2] pool set, KEYS[3] admitted_tool set, then the session hashes,
-- then the node hashes, then (only with tool samples) the tool statistics hash.
-- ARGV[1] JSON {"c": [[key index, v, updated_at, probe], ...], "s": [[key index, raw id,
-- new 0/1, pooled, in tool, field, value, field, value, ...], ...], "r": [[key index, reserved
-- delta, contexts delta, held delta], ...] (false: that total does not move), "t": [[field,
-- old, new], ...], "k": key index of the statistics hash}.
--
-- ARGV[2..]: the session fields a moved hash is sent back with (store_codec.SESSION_FIELDS).
--
-- 1. The check: every session hash the batch read (or took from its cache of what it last
--    wrote) must still hold what Python folded from: `v`, `updated_at` and `probe` as given
--    ("" = no field), or no record at all (`v` false: no `data`). Every writer of a session
--    hash bumps `v` (the transitions, lua/apply.lua) except the probe mark (lua/probe.lua),
--    checked by itself; `updated_at` guards against a record deleted and made again
--    meanwhile. Every statistics field the samples fold into must still hold its old text
--    (false: absent). If anything moved, nothing is written and the reply is
--    {{key index, HMGET of ARGV[2..]} per moved hash, HGETALL of the statistics hash if one
--    of its fields moved (else nil)}: Python folds again on what is there now, as a failed
--    EXEC under WATCH made it read again.
-- 2. The writes. `new` 1: the record did not exist (SADD to the sessions set). `pooled` /
--    `in tool`: 1 add to the index set, 0 remove from it, -1 membership unchanged (Python
--    compared the stored record with the new one). Only changed fields are sent. Every value
--    is a string written as given (floats are never formatted here); the deltas are integer
--    strings added with HINCRBY (0 included: the node hash then exists, as after the single
--    updates). Returns 1.
local batch = cjson.decode(ARGV[1])
local moved = {}
for _, c in ipairs(batch.c) do
  local key = KEYS[c[1]]
  local h = redis.call('HMGET', key, 'v', 'updated_at', 'probe', 'data')
  local stale
  if c[2] == false then
    stale = h[4] ~= false
  else
    stale = not h[4] or (h[1] or '') ~= c[2] or (h[2] or '') ~= c[3] or (h[3] or '') ~= c[4]
  end
  if stale then
    moved[#moved + 1] = {c[1], unpack(redis.call('HMGET', key, unpack(ARGV, 2)))}
  end
end
local stats_moved = false
for _, t in ipairs(batch.t) do
  if redis.call('HGET', KEYS[batch.k], t[1]) ~= t[2] then
    stats_moved = true
    break
  end
end
if #moved > 0 or stats_moved then
  local stats = false
  if stats_moved then stats = redis.call('HGETALL', KEYS[batch.k]) end
  return {moved, stats}
end
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
  if r[2] ~= false then
    redis.call('HINCRBY', KEYS[r[1]], 'reserved', r[2])
  end
  if r[3] ~= false then
    redis.call('HINCRBY', KEYS[r[1]], 'contexts', r[3])
    redis.call('HINCRBY', KEYS[r[1]], 'held', r[4])
  end
end
for _, t in ipairs(batch.t) do
  redis.call('HSET', KEYS[batch.k], t[1], t[3])
end
return 1
