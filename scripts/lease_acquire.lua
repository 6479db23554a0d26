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
-- Reply: an array of integers, the lease scripts' shape (lease_extend.lua replies the first
-- three)
--   [1] granted: 1 when the lease was granted, 0 when the key is full
--   [2] now in microseconds: the instant of the decision
--   [3] when granted, the new lease's expiry in microseconds (now + ttl); 0 when denied
--   [4] holders: the unexpired leases of the key after the decision (the new one included)
--   [5] when denied, the soonest held lease's expiry in microseconds (a slot is free by then
--       at the latest; a release may free one sooner)
--   [6] when denied, the last held lease's expiry in microseconds (the key holds none then)
-- A member that already exists under the new id is an error reply: ids are never reused. A
-- key that holds another type is BADLAYOUT (lib_lease.lua).

-- include: lib_request.lua
-- include: lib_lease.lua

local key = KEYS[1]
local now, server_clock = read_clock(ARGV[1])
local max = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])

-- A lease whose expiry is at or before now has freed its slot.
checked(key, redis.pcall('ZREMRANGEBYSCORE', key, '-inf', now))
local held = redis.call('ZCARD', key)
if held >= max then
  local soonest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  local latest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  return {0, now, 0, held, tonumber(soonest[2]), tonumber(latest[2])}
end
local expires = now + ttl
if redis.call('ZADD', key, 'NX', expires, ARGV[4]) == 0 then
  return redis.error_reply('ERR strictrate: lease id already in use')
end
keep_until(key, now, expires, held == 0, server_clock)
return {1, now, expires, held + 1}
