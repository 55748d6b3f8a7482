-- Read many sessions and their residency in one command, skipping records the caller holds
-- (store_reads.SessionReader.read, shared/infra/store_reads.py; the valuation tick's reads of
-- the interrupt candidates and of every admitted session).
-- KEYS[1] the hash of the first session (it names the slot: every key read here carries the
-- domain's hash tag, as in lua/read_index.lua).
-- ARGV[1] the session hash prefix, ARGV[2] the residency hash prefix, or "" for no residency
-- (out[2i] is empty: a caller that needs the records only, the valuation's context total over
-- every admitted session). A key is its prefix followed by the escaped id.
-- ARGV[3] one line per session, in order: "<escaped id> <v> <updated_at>\n" as the caller
-- holds it, or "<escaped id> -\n" when it holds none. One argument, not one key and one
-- argument per session: redis-py's per-argument encoding was most of a large read's cost.
-- Returns, per session i, two replies:
--   out[2i-1] = {}                                    the record is absent (no version)
--             = {v, updated_at, probe}                v and updated_at are what the caller holds
--             = HMGET v node weight activity ended probe updated_at data   otherwise
--   out[2i]   = HGETALL of the residency hash (flat: node, "k0 t_obs", ...)
-- Values are only copied and compared as strings, never computed (Python decides).
local sprefix, rprefix = ARGV[1], ARGV[2]
local out = {}
local i = 0
for tok, held in string.gmatch(ARGV[3], '(%S+) ([^\n]*)\n') do
  i = i + 1
  local key = sprefix .. tok
  local head = redis.call('HMGET', key, 'v', 'updated_at', 'probe')
  if not head[1] then
    out[2 * i - 1] = {}
  elseif head[2] and head[1] .. ' ' .. head[2] == held then
    out[2 * i - 1] = {head[1], head[2], head[3]}
  else
    out[2 * i - 1] = redis.call(
      'HMGET', key, 'v', 'node', 'weight', 'activity', 'ended', 'probe', 'updated_at', 'data')
  end
  if rprefix == '' then
    out[2 * i] = {}
  else
    out[2 * i] = redis.call('HGETALL', rprefix .. tok)
  end
end
return out
