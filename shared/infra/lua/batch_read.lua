-- Read the same fields of many session hashes in one command (Store.update_sessions_with,
-- shared/infra/store.py: store_codec.SESSION_FIELDS; store_reads.idle_candidates: the four
-- fields of the idle rule). KEYS: the hashes; ARGV: the field names to read, in order.
-- Returns {HMGET KEYS[1] ARGV..., HMGET KEYS[2] ARGV..., ...} (all nil = absent).
local out = {}
for i = 1, #KEYS do
  out[i] = redis.call('HMGET', KEYS[i], unpack(ARGV))
end
return out
