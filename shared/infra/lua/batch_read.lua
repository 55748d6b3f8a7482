-- Read many session hashes in one command (Store.update_sessions_with, shared/infra/store.py).
-- KEYS: the hashes; ARGV: the field names to read (store_codec.SESSION_FIELDS, in order).
-- Returns {HMGET KEYS[1] ARGV..., HMGET KEYS[2] ARGV..., ...} (all nil = absent).
local out = {}
for i = 1, #KEYS do
  out[i] = redis.call('HMGET', KEYS[i], unpack(ARGV))
end
return out
