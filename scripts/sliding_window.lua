-- sliding_window.lua: one atomic sliding-window-log decision for one key.
--
-- Trims the events that left the window, counts the rest, adds n events only when they fit,
-- and sets the key's expiry. Runs as EVALSHA; nothing can interleave, so the count is exact.
--
-- KEYS[1]  the key's sorted set: one member per admitted event, scored by the event's time in
--          integer microseconds since the Unix epoch
-- ARGV[1]  now in integer microseconds, or "" to read the server's clock (TIME)
-- ARGV[2]  window in integer microseconds (>= 1000)
-- ARGV[3]  max: events admitted in any trailing window (>= 1)
-- ARGV[4]  n: events this request asks for, all or nothing (1 <= n <= max)
--
-- Reply: an array of 2 to 4 integers; a missing trailing value takes its default
--   [1] remaining: events that would still be admitted now, after this decision (>= 0)
--   [2] now in microseconds: the instant the decision was taken at
--   [3] retry_after in microseconds: 0 (the default) when admitted; when denied (always > 0),
--       the wait until the oldest event that must leave for n to fit stops counting
--   [4] reset_after in microseconds: the wait until the log holds no event; default: the window
--
-- An event at t counts at now when now - window < t. Events later than now (possible only when
-- callers' clocks disagree) count too: that can deny early, never admit too many.
--
-- Members are made by add_events (lib_events.lua): unique within the key, never overwritten.
--
-- The common path (n = 1, a free microsecond) makes five server calls (TIME, ZREMRANGEBYSCORE,
-- ZCARD, ZADD, PEXPIRE), builds no string in Lua and replies with two integers: every
-- redis.call, argument and reply element costs the server's single thread measurably.

-- include: lib_clock.lua
-- include: lib_events.lua

local key = KEYS[1]
local now, server_clock = read_clock(ARGV[1])
local window = tonumber(ARGV[2])
local max = tonumber(ARGV[3])
local n = tonumber(ARGV[4])

redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
local count = redis.call('ZCARD', key)

if count + n > max then
  -- Denied: the (count + n - max)-th oldest event must leave before n fit again.
  local leave = count + n - max
  local oldest = redis.call('ZRANGE', key, leave - 1, leave - 1, 'WITHSCORES')
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  local remaining = max - count
  if remaining < 0 then remaining = 0 end
  return {remaining, now, oldest[2] + window - now, newest[2] + window - now}
end

-- The log empties one window after its newest event. With the server's clock that is the event
-- added now; a caller's clock may lag an event another caller recorded, so look.
local reset_after = window
if not server_clock and count > 0 then
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2] + 0
  if newest > now then
    reset_after = newest + window - now
  end
end

add_events(key, now, n, count)

-- PEXPIRE takes whole milliseconds: round up so the key never goes before its newest event.
redis.call('PEXPIRE', key, math.ceil(reset_after / 1000))
if reset_after == window then
  return {max - count - n, now}
end
return {max - count - n, now, 0, reset_after}
