-- sliding_window_peek.lua: the decision sliding_window.lua would take, without recording it.
--
-- Read-only (runs as EVALSHA_RO, so replicas may serve it): it neither trims nor adds, and
-- counts only the events still inside the window.
--
-- KEYS[1]  the key's sorted set, as in sliding_window.lua
-- ARGV[1]  now in integer microseconds, or "" to read the server's clock (TIME)
-- ARGV[2]  window in integer microseconds (>= 1000)
-- ARGV[3]  max: events admitted in any trailing window (>= 1)
-- ARGV[4]  n: events the request would ask for (1 <= n <= max)
--
-- Reply: an array of 4 integers, shaped as sliding_window.lua's
--   [1] remaining: events that would be admitted now (nothing is recorded) (>= 0)
--   [2] now in microseconds: the instant the decision was taken at
--   [3] retry_after in microseconds: 0 when n would be admitted; else (> 0) the wait until
--       n would fit
--   [4] reset_after in microseconds: the wait until the log holds no event; 0 when empty

-- include: lib_clock.lua

local key = KEYS[1]
local now = read_clock(ARGV[1])
local window = tonumber(ARGV[2])
local max = tonumber(ARGV[3])
local n = tonumber(ARGV[4])

local since = string.format('(%d', now - window)
local count = redis.call('ZCOUNT', key, since, '+inf')
if count == 0 then
  return {max, now, 0, 0}
end

local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
local reset_after = newest[2] + window - now
local remaining = max - count
if remaining < 0 then remaining = 0 end
if count + n <= max then
  return {remaining, now, 0, reset_after}
end
local leave = count + n - max
local oldest = redis.call('ZRANGE', key, since, '+inf', 'BYSCORE', 'LIMIT', leave - 1, 1, 'WITHSCORES')
return {remaining, now, oldest[2] + window - now, reset_after}
