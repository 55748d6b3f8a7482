-- Recount every node's context totals (`contexts`: Σ tokens, `held`: how many) from the
-- session records themselves, in one atomic step (Store.rebuild_contexts,
-- shared/infra/store.py). The session writes keep the totals as they go (store_types.
-- context_of); this sets them right where they were never kept (records written before the
-- totals existed) or drifted. The valuation runs it when it starts.
-- KEYS[1] the sessions set. ARGV[1] the session hash prefix, ARGV[2] the node hash prefix,
-- ARGV[3] the nodes set (not a declared key, as in lua/read_index.lua: every key here carries
-- the domain's hash tag). A session key is its prefix and the escaped id, as
-- keys.check_session_id escapes it. A session counts when its hash names a node and it has
-- not ended; its tokens are read from its JSON (`data`), which every transition writes whole.
-- Every node of the nodes set, and every node a session names, gets both fields.
-- Returns the number of sessions counted.
local function escape(c)
  return string.format('~%02X', string.byte(c))
end
local totals = {}
local counted = 0
for _, sid in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local tok = (string.gsub(sid, '[^A-Za-z0-9_%-]', escape))
  local f = redis.call('HMGET', ARGV[1] .. tok, 'node', 'ended', 'data')
  if f[1] and f[1] ~= '' and f[2] ~= '1' and f[3] then
    local t = totals[f[1]] or {0, 0}
    t[1] = t[1] + (cjson.decode(f[3]).tokens or 0)
    t[2] = t[2] + 1
    totals[f[1]] = t
    counted = counted + 1
  end
end
for _, node in ipairs(redis.call('SMEMBERS', ARGV[3])) do
  totals[node] = totals[node] or {0, 0}
end
for node, t in pairs(totals) do
  redis.call('HSET', ARGV[2] .. node, 'contexts', string.format('%d', t[1]),
             'held', string.format('%d', t[2]))
end
return counted
