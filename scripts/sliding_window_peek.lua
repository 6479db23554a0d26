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
-- Reply: an array of five integers
--   [1] allowed: 1 when n events would be admitted now, else 0
--   [2] remaining: events that would be admitted now (nothing is recorded) (>= 0)
--   [3] retry_after in microseconds: 0 when allowed; else the wait until n would fit
--   [4] reset_after in microseconds: the wait until the log holds no event; 0 when empty
--   [5] now in microseconds: the instant the decision was taken at

local key = KEYS[1]
local now = tonumber(ARGV[1])
if now == nil then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local window = tonumber(ARGV[2])
local max = tonumber(ARGV[3])
local n = tonumber(ARGV[4])

local since = string.format('(%d', now - window)
local count = redis.call('ZCOUNT', key, since, '+inf')
if count == 0 then
  return {1, max, 0, 0, now}
end

local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
local reset_after = tonumber(newest[2]) + window - now
local remaining = max - count
if remaining < 0 then remaining = 0 end
if count + n <= max then
  return {1, remaining, 0, reset_after, now}
end
local leave = count + n - max
local oldest = redis.call('ZRANGE', key, since, '+inf', 'BYSCORE', 'LIMIT', leave - 1, 1, 'WITHSCORES')
return {0, remaining, tonumber(oldest[2]) + window - now, reset_after, now}
