-- Read the same few fields of many hashes in one command (store_reads.idle_candidates, the
-- valuation service's idle sweep). KEYS: the hashes; ARGV: the field names.
-- Returns {HMGET KEYS[1] ARGV..., HMGET KEYS[2] ARGV..., ...} (a missing field is nil).
local out = {}
for i = 1, #KEYS do
  out[i] = redis.call('HMGET', KEYS[i], unpack(ARGV))
end
return out
