-- Persist readiness probe marks without a version bump (DESIGN 3.1 rule 2).
-- KEYS[i] the hash of session i; ARGV[2i-1] its mark ("" = none), ARGV[2i] the version it
-- must still have ("" = any). A session that is gone, or whose version moved, is skipped.
-- Returns how many marks were written.
local written = 0
for i = 1, #KEYS do
  local v = redis.call('HGET', KEYS[i], 'v')
  local want = ARGV[2 * i]
  if v and (want == '' or v == want) then
    redis.call('HSET', KEYS[i], 'probe', ARGV[2 * i - 1])
    written = written + 1
  end
end
return written
