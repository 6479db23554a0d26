-- lease_extend.lua: moves a held lease's expiry to now + ttl (a holder's heartbeat).
--
-- Only a lease that is still held can be extended: one that has expired (whether or not a
-- later acquire dropped it yet) or was released has lost its slot, which another holder may
-- have taken since. Such a lease is dropped, if it is still there, and the reply says so.
--
-- KEYS[1]  the key's leases, as in lease_acquire.lua
-- ARGV[1]  now in integer microseconds, or "" to read the server's clock (TIME)
-- ARGV[2]  ttl in integer microseconds (>= 1000): the lease then expires at now + ttl
-- ARGV[3]  the lease's id
--
-- Reply: an array of 2 or 3 integers, the first of lease_acquire.lua's
--   [1] 1 when the lease was held and is extended; 0 when it has expired or is not held
--   [2] now in microseconds: the instant of the decision
--   [3] when extended, the lease's new expiry in microseconds (now + ttl)
-- A key that holds another type is BADLAYOUT (lib_lease.lua).

-- include: lib_request.lua
-- include: lib_lease.lua

local key = KEYS[1]
local now, server_clock = read_clock(ARGV[1])
local ttl = tonumber(ARGV[2])
local id = ARGV[3]

local score = checked(key, redis.pcall('ZSCORE', key, id))
if not score then
  return {0, now}
end
if tonumber(score) <= now then
  redis.call('ZREM', key, id)
  return {0, now}
end
local expires = now + ttl
redis.call('ZADD', key, 'XX', expires, id)
keep_until(key, now, expires, false, server_clock)
return {1, now, expires}
