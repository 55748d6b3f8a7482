-- Read many sessions and their residency in one command, skipping records the caller holds
-- (store_reads.SessionReader, shared/infra/store_reads.py; the valuation tick's read path).
-- KEYS[2i-1] the hash of session i, KEYS[2i] its residency hash.
-- ARGV[2i-1], ARGV[2i]: the version and updated_at text the caller holds for session i
-- ("" and "" when it holds none).
-- Returns, per session i, two replies:
--   out[2i-1] = {}                                    the record is absent (no version)
--             = {v, updated_at, probe}                v and updated_at equal what the caller holds
--             = HMGET v node weight activity ended probe updated_at data   otherwise
--   out[2i]   = HGETALL of the residency hash (flat: node, "k0 t_obs", ...)
-- Values are only copied, never computed (Python decides).
local out = {}
for i = 1, #KEYS / 2 do
  local key = KEYS[2 * i - 1]
  local head = redis.call('HMGET', key, 'v', 'updated_at', 'probe')
  if not head[1] then
    out[2 * i - 1] = {}
  elseif head[1] == ARGV[2 * i - 1] and head[2] == ARGV[2 * i] then
    out[2 * i - 1] = {head[1], head[2], head[3]}
  else
    out[2 * i - 1] = redis.call(
      'HMGET', key, 'v', 'node', 'weight', 'activity', 'ended', 'probe', 'updated_at', 'data')
  end
  out[2 * i] = redis.call('HGETALL', KEYS[2 * i])
end
return out
