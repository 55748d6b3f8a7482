-- Verify-and-apply one planner decision atomically (DESIGN 3.4).
-- Mirrors shared.core.tick.apply_decision exactly; see shared/infra/store.py (Store.apply).
--
-- KEYS[1] pool set, KEYS[2] admitted_tool set, KEYS[3] planner counters hash,
-- KEYS[3+i] the hash of session i (i = 1..S).
-- ARGV[1] at (repr float, stored as given), ARGV[2] node key prefix, ARGV[3] S,
-- ARGV[4] NI (interrupts), ARGV[5] NA (admits), ARGV[5+i] raw id of session i,
-- then per move (interrupts first, then admits in plan order) 4 values:
-- session index, node id, weight, version; last, the planner's epoch (0: not fenced).
-- Returns {2} when fenced (the epoch is below the domain's, field `epoch` of KEYS[3]: a
-- deposed leader's late plan, shared/infra/lease.py), {0, {changed session indexes}} when
-- discarded, else {1, admitted count, truncated 0/1, {session index, HGETALL of it, ...}}.
-- Floats are never formatted here: `at` is copied, integers are added with HINCRBY.

local at = ARGV[1]
local nprefix = ARGV[2]
local S = tonumber(ARGV[3])
local NI = tonumber(ARGV[4])
local NA = tonumber(ARGV[5])
local ids = {}
for i = 1, S do
  ids[i] = ARGV[5 + i]
end
local moves = {}
local base = 5 + S
for j = 1, NI + NA do
  local o = base + (j - 1) * 4
  moves[j] = {
    s = tonumber(ARGV[o + 1]),
    node = ARGV[o + 2],
    weight = tonumber(ARGV[o + 3]),
    wtext = ARGV[o + 3],
    version = tonumber(ARGV[o + 4]),
  }
end

local epoch = tonumber(ARGV[base + (NI + NA) * 4 + 1] or '0')
if epoch > 0 then
  local fence = tonumber(redis.call('HGET', KEYS[3], 'epoch') or '0')
  if epoch < fence then
    redis.call('HINCRBY', KEYS[3], 'plans_fenced', 1)
    return {2}
  end
  if epoch > fence then
    redis.call('HSET', KEYS[3], 'epoch', epoch)
  end
end

local live = {}
for i = 1, S do
  local f = redis.call('HMGET', KEYS[3 + i], 'v', 'node', 'weight', 'activity', 'ended')
  if f[1] then
    live[i] = {v = tonumber(f[1]), node = f[2] or '', weight = tonumber(f[3] or '0'),
               activity = f[4], ended = f[5]}
  end
end

local nodes = {}
local function node(id)
  local n = nodes[id]
  if n == nil then
    local f = redis.call('HMGET', nprefix .. id, 'healthy', 'usable', 'reserved')
    n = {healthy = (f[1] == '1'), usable = tonumber(f[2] or '0') or 0,
         reserved = tonumber(f[3] or '0') or 0}
    nodes[id] = n
  end
  return n
end

-- 1. signatures: any named session gone or with another version, or an admit's node missing
--    or unhealthy, discards the whole decision.
local changed, seen = {}, {}
local function mark(i)
  if not seen[i] then
    seen[i] = true
    changed[#changed + 1] = i
  end
end
for j = 1, NI + NA do
  local m = moves[j]
  local s = live[m.s]
  if s == nil or s.v ~= m.version then
    mark(m.s)
  end
end
for j = NI + 1, NI + NA do
  if not node(moves[j].node).healthy then
    mark(moves[j].s)
  end
end
if #changed > 0 then
  redis.call('HINCRBY', KEYS[3], 'plans_discarded', 1)
  return {0, changed}
end

-- 2. room: live free capacity of healthy nodes (usable - reserved, negative while reservations
--    that grew after admission over-commit the node: an interrupt there first pays that back),
--    0 elsewhere (only interrupts reach those).
local room = {}
local function getroom(id)
  if room[id] == nil then
    local n = node(id)
    if n.healthy then
      room[id] = n.usable - n.reserved
    else
      room[id] = 0
    end
  end
  return room[id]
end

-- 3. interrupts, then the longest admit prefix that fits; each final record is the
--    transition of the LIVE record (as in apply_decision: the last move on a session wins).
local final, order = {}, {}
local function set_final(i, rec)
  if final[i] == nil then
    order[#order + 1] = i
  end
  final[i] = rec
end
for j = 1, NI do
  local m = moves[j]
  set_final(m.s, {node = '', weight = 0, wtext = '0', activity = live[m.s].activity})
  room[m.node] = getroom(m.node) + m.weight
end
local admitted, truncated = 0, 0
for j = NI + 1, NI + NA do
  local m = moves[j]
  local r = getroom(m.node)
  if m.weight > r then
    truncated = 1
    break
  end
  room[m.node] = r - m.weight
  local act = live[m.s].activity
  if act == 'waiting' then
    act = 'running'
  end
  set_final(m.s, {node = m.node, weight = m.weight, wtext = m.wtext, activity = act})
  admitted = admitted + 1
end

-- 4. write: fields, version + 1, reserved totals (old node - old weight, new + new), the
--    context totals where the node changed (old node - tokens and one held, new + both; the
--    tokens are the one value read from the record's JSON: an admission never changes them),
--    indexes.
local out = {}
for _, i in ipairs(order) do
  local key = KEYS[3 + i]
  local s, f = live[i], final[i]
  redis.call('HSET', key, 'node', f.node, 'weight', f.wtext, 'activity', f.activity,
             'updated_at', at)
  redis.call('HINCRBY', key, 'v', 1)
  if s.node ~= '' and s.weight ~= 0 then
    redis.call('HINCRBY', nprefix .. s.node, 'reserved', -s.weight)
  end
  if f.node ~= '' and f.weight ~= 0 then
    redis.call('HINCRBY', nprefix .. f.node, 'reserved', f.wtext)
  end
  if s.node ~= f.node and s.ended ~= '1' then  -- the context totals (store_types.context_of)
    -- as integer text: a Lua number would be sent as "-0" or "1e+15", which HINCRBY refuses
    local tokens = cjson.decode(redis.call('HGET', key, 'data')).tokens or 0
    if s.node ~= '' then
      redis.call('HINCRBY', nprefix .. s.node, 'contexts', string.format('%d', -tokens))
      redis.call('HINCRBY', nprefix .. s.node, 'held', -1)
    end
    if f.node ~= '' then
      redis.call('HINCRBY', nprefix .. f.node, 'contexts', string.format('%d', tokens))
      redis.call('HINCRBY', nprefix .. f.node, 'held', 1)
    end
  end
  local pooled = f.node == '' and s.ended ~= '1' and (f.activity == 'waiting' or f.activity == 'tool')
  if pooled then
    redis.call('SADD', KEYS[1], ids[i])
  else
    redis.call('SREM', KEYS[1], ids[i])
  end
  if f.node ~= '' and f.activity == 'tool' then
    redis.call('SADD', KEYS[2], ids[i])
  else
    redis.call('SREM', KEYS[2], ids[i])
  end
  out[#out + 1] = i
  out[#out + 1] = redis.call('HGETALL', key)
end
redis.call('HINCRBY', KEYS[3], 'plans_applied', 1)
redis.call('HINCRBY', KEYS[3], 'sessions_admitted', admitted)
redis.call('HINCRBY', KEYS[3], 'sessions_interrupted', NI)
if truncated == 1 then
  redis.call('HINCRBY', KEYS[3], 'plans_truncated', 1)
end
return {1, admitted, truncated, out}
