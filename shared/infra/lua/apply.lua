-- Verify-and-apply one planner decision atomically (DESIGN 3.4).
-- Mirrors shared.core.tick.apply_decision exactly; see shared/infra/store.py (Store.apply).
--
-- KEYS[1] pool set, KEYS[2] admitted_tool set, KEYS[3] planner counters hash,
-- KEYS[3+i] the hash of session i (i = 1..S).
-- ARGV[1] at (repr float, stored as given), ARGV[2] node key prefix, ARGV[3] S,
-- ARGV[4] NI (interrupts), ARGV[5] NA (admits), ARGV[5+i] raw id of session i,
-- then per move (interrupts first, then admits in plan order) 5 values:
-- session index, node id, weight, version, eligibility digest ('' : not checked); then the
-- planner's epoch (0: not fenced); last, the nodes set (not a declared key, as in
-- lua/read_index.lua: every key here carries the domain's hash tag).
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
  local o = base + (j - 1) * 5
  moves[j] = {
    s = tonumber(ARGV[o + 1]),
    node = ARGV[o + 2],
    weight = tonumber(ARGV[o + 3]),
    wtext = ARGV[o + 3],
    version = tonumber(ARGV[o + 4]),
    digest = ARGV[o + 5],
  }
end
local nodes_set = ARGV[base + (NI + NA) * 5 + 2]

local epoch = tonumber(ARGV[base + (NI + NA) * 5 + 1] or '0')
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
    local f = redis.call('HMGET', nprefix .. id, 'healthy', 'usable', 'reserved', 'models')
    n = {healthy = (f[1] == '1'), usable = tonumber(f[2] or '0') or 0,
         reserved = tonumber(f[3] or '0') or 0, models = f[4]}
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

-- 1b. eligibility: an admit that carries a digest (its candidate's eligible set when it was
--     valued, shared.core.signature) discards the decision when the digest of the session's
--     live eligible set differs: every node of the nodes set that is healthy, serves the
--     session's model (`models` null: any; the session's `model` null: any node) and whose
--     usable capacity holds the admit's weight (shared.core.tick.live_eligible). Redis has no
--     BLAKE2b, so the digest (shared.core.signature.eligibility_digest: 8-byte BLAKE2b,
--     personal 'tao-elig-v1', over the ids sorted by byte, each after its 4-byte big-endian
--     length) is computed below; once per distinct set.
local check = false
for j = NI + 1, NI + NA do
  if moves[j].digest ~= '' and live[moves[j].s] ~= nil then
    check = true
  end
end
if check then
  -- BLAKE2b-64 (8-byte digest, personal 'tao-elig-v1'), 64-bit words as {hi, lo} 32-bit halves
  local band, bor, bxor, bnot = bit.band, bit.bor, bit.bxor, bit.bnot
  local lshift, rshift, tobit = bit.lshift, bit.rshift, bit.tobit
  local TWO32 = 4294967296
  local IVH = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
               0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19}
  local IVL = {0xf3bcc908, 0x84caa73b, 0xfe94f82b, 0x5f1d36f1,
               0xade682d1, 0x2b3e6c1f, 0xfb41bd6b, 0x137e2179}
  for i = 1, 8 do
    IVH[i], IVL[i] = tobit(IVH[i]), tobit(IVL[i])
  end
  local SIGMA = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
  }
  -- 0-based word indexes of each G's (a, b, c, d), two rounds' halves
  local GI = {{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15},
              {0, 5, 10, 15}, {1, 6, 11, 12}, {2, 7, 8, 13}, {3, 4, 9, 14}}

  local function word(s, o)  -- little-endian 32-bit word of s at byte o (1-based)
    local a, b, c, d = string.byte(s, o, o + 3)
    return tobit(bor(a, lshift(b, 8), lshift(c, 16), lshift(d, 24)))
  end

  local function compress(hh, hl, block, t, last)
    local vh, vl, mh, ml = {}, {}, {}, {}
    for i = 0, 7 do
      vh[i], vl[i] = hh[i], hl[i]
      vh[i + 8], vl[i + 8] = IVH[i + 1], IVL[i + 1]
    end
    for i = 0, 15 do
      ml[i] = word(block, i * 8 + 1)
      mh[i] = word(block, i * 8 + 5)
    end
    vl[12] = bxor(vl[12], tobit(t))  -- t < 2^32: the high words of the counter stay 0
    if last then
      vh[14], vl[14] = bnot(vh[14]), bnot(vl[14])
    end
    for r = 0, 11 do
      local s = SIGMA[(r % 10) + 1]
      for g = 1, 8 do
        local ix = GI[g]
        local a, b, c, d = ix[1], ix[2], ix[3], ix[4]
        local x, y = s[2 * g - 1], s[2 * g]
        -- a = a + b + m[x]; d = (d ^ a) >>> 32
        local lo = (vl[a] % TWO32) + (vl[b] % TWO32) + (ml[x] % TWO32)
        vh[a] = tobit(vh[a] + vh[b] + mh[x] + math.floor(lo / TWO32))
        vl[a] = tobit(lo)
        vh[d], vl[d] = bxor(vl[d], vl[a]), bxor(vh[d], vh[a])
        -- c = c + d; b = (b ^ c) >>> 24
        lo = (vl[c] % TWO32) + (vl[d] % TWO32)
        vh[c] = tobit(vh[c] + vh[d] + math.floor(lo / TWO32))
        vl[c] = tobit(lo)
        local th, tl = bxor(vh[b], vh[c]), bxor(vl[b], vl[c])
        vh[b] = bor(rshift(th, 24), lshift(tl, 8))
        vl[b] = bor(rshift(tl, 24), lshift(th, 8))
        -- a = a + b + m[y]; d = (d ^ a) >>> 16
        lo = (vl[a] % TWO32) + (vl[b] % TWO32) + (ml[y] % TWO32)
        vh[a] = tobit(vh[a] + vh[b] + mh[y] + math.floor(lo / TWO32))
        vl[a] = tobit(lo)
        th, tl = bxor(vh[d], vh[a]), bxor(vl[d], vl[a])
        vh[d] = bor(rshift(th, 16), lshift(tl, 16))
        vl[d] = bor(rshift(tl, 16), lshift(th, 16))
        -- c = c + d; b = (b ^ c) >>> 63
        lo = (vl[c] % TWO32) + (vl[d] % TWO32)
        vh[c] = tobit(vh[c] + vh[d] + math.floor(lo / TWO32))
        vl[c] = tobit(lo)
        th, tl = bxor(vh[b], vh[c]), bxor(vl[b], vl[c])
        vh[b] = bor(lshift(th, 1), rshift(tl, 31))
        vl[b] = bor(lshift(tl, 1), rshift(th, 31))
      end
    end
    for i = 0, 7 do
      hh[i] = bxor(hh[i], vh[i], vh[i + 8])
      hl[i] = bxor(hl[i], vl[i], vl[i + 8])
    end
  end

  local PERSON = 'tao-elig-v1' .. string.rep('\0', 5)
  local function blake2b8(msg)
    local hh, hl = {}, {}
    for i = 0, 7 do
      hh[i], hl[i] = IVH[i + 1], IVL[i + 1]
    end
    hl[0] = bxor(hl[0], 0x01010008)  -- digest length 8, no key, fanout 1, depth 1
    hl[6], hh[6] = bxor(hl[6], word(PERSON, 1)), bxor(hh[6], word(PERSON, 5))
    hl[7], hh[7] = bxor(hl[7], word(PERSON, 9)), bxor(hh[7], word(PERSON, 13))
    local n = #msg
    local off = 0
    while n - off > 128 do
      compress(hh, hl, string.sub(msg, off + 1, off + 128), off + 128, false)
      off = off + 128
    end
    local tail = string.sub(msg, off + 1)
    compress(hh, hl, tail .. string.rep('\0', 128 - #tail), n, true)
    local out = {}
    for _, w in ipairs({hl[0], hh[0]}) do
      for k = 0, 3 do
        out[#out + 1] = string.format('%02x', band(rshift(w, 8 * k), 0xff))
      end
    end
    return table.concat(out)
  end

  local function bytes_less(a, b)  -- byte order (Lua's `<` follows the server's locale)
    local n = math.min(#a, #b)
    for k = 1, n do
      local x, y = string.byte(a, k), string.byte(b, k)
      if x ~= y then
        return x < y
      end
    end
    return #a < #b
  end
  local all = redis.call('SMEMBERS', nodes_set)
  table.sort(all, bytes_less)
  local function serves(n, model)
    if model == nil or not n.models or n.models == '' then
      return true
    end
    if n.served == nil then
      local list = cjson.decode(n.models)
      n.served = false  -- null: any model
      if type(list) == 'table' then
        n.served = {}
        for _, x in ipairs(list) do
          n.served[x] = true
        end
      end
    end
    return n.served == false or n.served[model] == true
  end
  local by_key, by_set = {}, {}
  local function live_digest(model, weight)
    local key = (model and ('m' .. model) or '*') .. '\n' .. string.format('%d', weight)
    local d = by_key[key]
    if d == nil then
      local enc = {}
      for _, id in ipairs(all) do
        local n = node(id)
        if n.healthy and serves(n, model) and weight <= n.usable then
          local len = #id
          enc[#enc + 1] = string.char(band(rshift(len, 24), 255), band(rshift(len, 16), 255),
                                      band(rshift(len, 8), 255), band(len, 255)) .. id
        end
      end
      local text = table.concat(enc)
      d = by_set[text]
      if d == nil then
        d = blake2b8(text)
        by_set[text] = d
      end
      by_key[key] = d
    end
    return d
  end
  for j = NI + 1, NI + NA do
    local m = moves[j]
    if m.digest ~= '' and live[m.s] ~= nil then
      local data = redis.call('HGET', KEYS[3 + m.s], 'data')
      local model = data and cjson.decode(data).model
      if type(model) ~= 'string' then
        model = nil
      end
      if live_digest(model, m.weight) ~= m.digest then
        mark(m.s)
      end
    end
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
