-- Read many sessions and their residency in one command, skipping records the caller holds
-- (store_reads.SessionReader, shared/infra/store_reads.py; the valuation tick's read path).
-- KEYS[i] the hash of session i. Its residency hash is ARGV[1] followed by what follows the
-- first ARGV[2] characters of KEYS[i] (the session hash prefix swapped for the residency one:
-- both carry the same escaped id and the domain's hash tag, so they share one slot).
-- ARGV[2+i]: "<v> <updated_at>" as the caller holds session i, or "" when it holds none.
-- ARGV[1] = "": no residency is read (out[2i] is empty), for a caller that needs the records
-- only (the valuation's context total over every admitted session).
-- Returns, per session i, two replies:
--   out[2i-1] = {}                                    the record is absent (no version)
--             = {v, updated_at, probe}                v and updated_at are what the caller holds
--             = HMGET v node weight activity ended probe updated_at data   otherwise
--   out[2i]   = HGETALL of the residency hash (flat: node, "k0 t_obs", ...)
-- Values are only copied and compared as strings, never computed (Python decides).
local rprefix = ARGV[1]
local cut = tonumber(ARGV[2]) + 1
local out = {}
for i = 1, #KEYS do
  local key = KEYS[i]
  local head = redis.call('HMGET', key, 'v', 'updated_at', 'probe')
  if not head[1] then
    out[2 * i - 1] = {}
  elseif head[2] and head[1] .. ' ' .. head[2] == ARGV[2 + i] then
    out[2 * i - 1] = {head[1], head[2], head[3]}
  else
    out[2 * i - 1] = redis.call(
      'HMGET', key, 'v', 'node', 'weight', 'activity', 'ended', 'probe', 'updated_at', 'data')
  end
  if rprefix == '' then
    out[2 * i] = {}
  else
    out[2 * i] = redis.call('HGETALL', rprefix .. string.sub(key, cut))
  end
end
return out
