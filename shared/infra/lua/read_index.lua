-- Read an index set's sessions, their residency and (optionally) every node in one command:
-- the valuation tick's read (store_reads.SessionReader.tick_read, shared/infra/store_reads.py).
-- One round trip and a handful of arguments, where SMEMBERS + read_sessions.lua + SMEMBERS +
-- one HGETALL per node took four round trips and two arguments per session.
-- KEYS[1] the index set (pool / admitted_tool).
-- ARGV[1] the session hash prefix, ARGV[2] the residency hash prefix, ARGV[3] the node hash
-- prefix (tao:{d}:s: / res: / n:): a key is its prefix followed by the escaped id, built here
-- as keys.check_session_id escapes it (every byte outside [A-Za-z0-9_-] as ~XX, upper-case hex;
-- a UTF-8 character is escaped byte by byte, as Python's c.encode() gives them). Every key
-- carries the domain's hash tag, so all of them share KEYS[1]'s slot.
-- ARGV[4] what the caller holds: lines "<escaped id> <v> <updated_at>\n".
-- ARGV[5] the nodes set, or "" for no nodes. Not a declared key: EVALSHA declares its keys
-- read-write, and the valuation's Redis user may only read the nodes set (shared/infra/
-- access.py); like the keys above it shares KEYS[1]'s slot.
-- ARGV[6] when given ("named"): ARGV[7..] are the raw ids to read instead of every member of
-- KEYS[1] (a wake-up tick's named read, SessionReader.tick_read(named=...); none: the nodes
-- only). Each comes back in the same three replies, with {} as its record when it is not a
-- member (or has no record).
-- Returns {sessions, nodes}:
--   sessions: per member of KEYS[1], three replies: the id, then
--               {}                                  the record is absent
--               {v, updated_at, probe}              v and updated_at are what the caller holds
--               HMGET v node weight activity ended probe updated_at data   otherwise
--             then the HGETALL of its residency hash (flat: node, "k0 t_obs", ...)
--   nodes:    per member of the nodes set, two replies: the id and the HGETALL of its hash (flat)
-- Values are only copied and compared as strings, never computed (Python decides).
local held = {}
for tok, token in string.gmatch(ARGV[4], '(%S+) (%S+ %S+)\n') do
  held[tok] = token
end
local function escape(c)
  return string.format('~%02X', string.byte(c))
end
local sessions = {}
local named = ARGV[6] ~= nil
local members
if named then
  members = {}
  for j = 7, #ARGV do
    members[#members + 1] = ARGV[j]
  end
else
  members = redis.call('SMEMBERS', KEYS[1])
end
for _, sid in ipairs(members) do
  local tok = (string.gsub(sid, '[^A-Za-z0-9_%-]', escape))
  local key = ARGV[1] .. tok
  local head = redis.call('HMGET', key, 'v', 'updated_at', 'probe')
  local rec
  if not head[1] or (named and redis.call('SISMEMBER', KEYS[1], sid) == 0) then
    rec = {}
  elseif head[2] and head[1] .. ' ' .. head[2] == held[tok] then
    rec = {head[1], head[2], head[3]}
  else
    rec = redis.call(
      'HMGET', key, 'v', 'node', 'weight', 'activity', 'ended', 'probe', 'updated_at', 'data')
  end
  sessions[#sessions + 1] = sid
  sessions[#sessions + 1] = rec
  sessions[#sessions + 1] = redis.call('HGETALL', ARGV[2] .. tok)
end
local nodes = {}
if ARGV[5] ~= '' then
  for _, node in ipairs(redis.call('SMEMBERS', ARGV[5])) do
    nodes[#nodes + 1] = node
    nodes[#nodes + 1] = redis.call('HGETALL', ARGV[3] .. node)
  end
end
return {sessions, nodes}
