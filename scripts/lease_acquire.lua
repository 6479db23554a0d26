-- lease_acquire.lua: takes one slot of a key's in-flight limit, if one is free.
--
-- Drops the leases that have expired, counts the rest, and adds the new lease only when fewer
-- than max are held; the key lives until its last lease expires. Runs as EVALSHA: nothing can
-- interleave, so no more than max unexpired leases ever exist for the key.
--
-- KEYS[1]  the key's leases (lib_lease.lua: a sorted set, one member per lease)
-- ARGV[1]  now in integer microseconds, or "" to read the server's clock (TIME)
-- ARGV[2]  max: leases held at once (>= 1)
-- ARGV[3]  ttl in integer microseconds (>= 1000): the new lease expires at now + ttl
-- ARGV[4]  the new lease's id: 16 random bytes, unique across processes
--
-- Reply: an array of 4 integers
--   [1] remaining: when granted, the slots still free after this lease (>= 0); 0 when denied
--   [2] now in microseconds: the instant of the decision
--   [3] retry_after in microseconds: 0 when granted; when denied (> 0), the wait until the
--       soonest lease expires (a release may free a slot sooner)
--   [4] when granted, the new lease's expiry in microseconds (now + ttl); when denied, the
--       wait until the last lease expires and the key holds none (reset_after)
-- A member that already exists under the new id is an error reply: ids are never reused.

-- include: lib_request.lua
-- include: lib_lease.lua

local key = KEYS[1]
local now, server_clock = read_clock(ARGV[1])
local max = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])

-- A lease whose expiry is at or before now has freed its slot.
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
local held = redis.call('ZCARD', key)
if held >= max then
  local soonest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  local latest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  return {0, now, tonumber(soonest[2]) - now, tonumber(latest[2]) - now}
end
local expires = now + ttl
if redis.call('ZADD', key, 'NX', expires, ARGV[4]) == 0 then
  return redis.error_reply('ERR strictrate: lease id already in use')
end
keep_until(key, now, expires, held == 0, server_clock)
return {max - held - 1, now, 0, expires}
