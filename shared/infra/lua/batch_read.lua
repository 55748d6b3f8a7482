-- Read many hashes in one command (Store.update_sessions_with, shared/infra/store.py).
-- KEYS: the hashes. Returns {HGETALL KEYS[1], HGETALL KEYS[2], ...} (empty list = absent).
local out = {}
for i = 1, #KEYS do
  out[i] = redis.call('HGETALL', KEYS[i])
end
return out
