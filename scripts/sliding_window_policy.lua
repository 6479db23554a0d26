-- sliding_window_policy.lua: one atomic decision for one key against several limits at once.
--
-- Every limit (max events in any trailing window) must admit the n events, or none is added.
-- One sorted set answers all of them: it is trimmed to the longest window, each window is
-- counted with ZCOUNT, and n events are added once. Runs as EVALSHA; nothing can interleave.
--
-- KEYS[1]  the key's sorted set: one member per admitted event, scored by the event's time in
--          integer microseconds since the Unix epoch (the same log as sliding_window.lua)
-- ARGV[1]  now in integer microseconds, or "" to read the server's clock (TIME)
-- ARGV[2]  n: events this request asks for, all or nothing (1 <= n <= every max)
-- ARGV[3]  window of the first limit in integer microseconds (>= 1000)
-- ARGV[4]  max of the first limit: events admitted in any trailing window (>= 1)
--          ... then one (window, max) pair per further limit, windows strictly ascending,
--          so the last pair is the longest window
--
-- Reply: an array of 5 integers, shaped as sliding_window.lua's plus the tightest limit
--   [1] remaining: the least, over the limits, of the events that would still be admitted
--       now, after this decision (>= 0)
--   [2] now in microseconds: the instant the decision was taken at
--   [3] retry_after in microseconds: 0 (the default) when admitted; when denied (always > 0),
--       the wait until every limit has room for n: the latest, over the denying limits, of
--       the moment the oldest event that must leave its window stops counting
--   [4] reset_after in microseconds: the wait until the log holds no event (its newest event
--       plus the longest window)
--   [5] tightest: the 1-based position, in ARGV order, of the limit [1] speaks for (the least
--       room; the shortest window among equals)
--
-- An event at t counts in a window at now when now - window < t, as in sliding_window.lua;
-- events later than now (callers' clocks disagree) count in every window.
--
-- Members are made by add_events (lib_events.lua), as in sliding_window.lua.

-- include: lib_clock.lua
-- include: lib_events.lua

local key = KEYS[1]
local now, server_clock = read_clock(ARGV[1])
local n = tonumber(ARGV[2])
local limits = (#ARGV - 2) / 2
local longest = tonumber(ARGV[#ARGV - 1])

redis.call('ZREMRANGEBYSCORE', key, '-inf', now - longest)
-- After the trim every event counts in the longest window: ZCARD is its count.
local total = redis.call('ZCARD', key)

local remaining = nil
local tightest = 1
local retry_after = 0
for i = 1, limits do
  local window = tonumber(ARGV[2 * i + 1])
  local max = tonumber(ARGV[2 * i + 2])
  local count = total
  local since = nil
  if i < limits then
    since = string.format('(%d', now - window)
    count = redis.call('ZCOUNT', key, since, '+inf')
  end
  if remaining == nil or max - count < remaining then
    remaining = max - count
    tightest = i
  end
  if count + n > max then
    -- This limit denies: the (count + n - max)-th oldest event of its window must leave.
    local leave = count + n - max
    local oldest
    if since == nil then
      oldest = redis.call('ZRANGE', key, leave - 1, leave - 1, 'WITHSCORES')
    else
      oldest = redis.call('ZRANGE', key, since, '+inf', 'BYSCORE', 'LIMIT', leave - 1, 1, 'WITHSCORES')
    end
    local wait = oldest[2] + window - now
    if wait > retry_after then
      retry_after = wait
    end
  end
end

if retry_after > 0 then
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if remaining < 0 then remaining = 0 end
  return {remaining, now, retry_after, newest[2] + longest - now, tightest}
end

-- The log empties one longest window after its newest event: the one added now, unless a
-- caller's clock lags an event another caller recorded.
local reset_after = longest
if not server_clock and total > 0 then
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2] + 0
  if newest > now then
    reset_after = newest + longest - now
  end
end

add_events(key, now, n, total)

-- PEXPIRE takes whole milliseconds: round up so the key never goes before its newest event.
redis.call('PEXPIRE', key, math.ceil(reset_after / 1000))
return {remaining - n, now, 0, reset_after, tightest}
