-- decide.lua: one atomic decision for one key against one or more limits.
--
-- Trims the entries that left the longest window, counts every window, adds one entry of cost
-- n only when every limit has room for it, and sets the key's expiry. Runs as EVALSHA; nothing
-- can interleave, so the counts are exact. The server's work does not grow with n: a request
-- is one entry, and each entry is trimmed once.
--
-- KEYS[1]  the key's log (lib_log.lua: a list, its header first)
-- ARGV[1]  now in integer microseconds, or "" to read the server's clock (TIME)
-- ARGV[2]  n: the request's cost in events, all or nothing (1 <= n <= every max)
-- ARGV[3]  window of the first limit in integer microseconds (>= 1000)
-- ARGV[4]  max of the first limit: events admitted in any trailing window (>= 1)
--          ... then one (window, max) pair per further limit, windows strictly ascending
--
-- Reply: an array of 2 to 7 integers; a missing trailing value takes its default
--   [1] remaining: the least, over the limits, of the events that would still be admitted
--       now, after this decision (>= 0)
--   [2] now in microseconds: the instant the decision was taken at
--   [3] retry_after in microseconds: 0 (the default) when admitted; when denied (always > 0),
--       the wait until every limit has room for n: per denying limit, until the entry that
--       brings enough events out of its window leaves it
--   [4] quota_after in microseconds: the wait until the first event in the window of the
--       limit [1] speaks for (after this decision) leaves it, when that limit next gets quota
--       back; default: that limit's window (the request admitted now is its only event)
--   [5] reset_after in microseconds: the wait until the log holds no event (its newest entry
--       plus the longest window); default: the longest window
--   [6] tightest: the 1-based position of the limit [1] speaks for (the least room; the
--       shortest window among equals); default 1
--   [7] seq: when admitted, the entry's position among the key's entries of this microsecond
--       (its identity, with [2], for refunds); default 1
--
-- The common path (one limit, the server's clock, a log of up to 32 live entries) makes four
-- server calls: TIME, LINDEX (the header, which holds the newest entries), LSET (the header
-- with the new entry), PEXPIRE. A bigger log adds an LRANGE of its oldest entries when some
-- leave the window, and now and then an RPUSH or an LTRIM.

-- include: lib_request.lua
-- include: lib_log.lua
-- include: lib_decide.lua

local now, n, limits, longest = read_request()
local remaining, _, retry_after, quota_after, reset_after, tightest, seq = decide_request(KEYS[1], now, n, limits)
if retry_after > 0 then
  if tightest ~= 1 then
    return {remaining, now, retry_after, quota_after, reset_after, tightest}
  end
  return {remaining, now, retry_after, quota_after, reset_after}
elseif seq ~= 1 then
  return {remaining, now, 0, quota_after, reset_after, tightest, seq}
elseif tightest ~= 1 then
  return {remaining, now, 0, quota_after, reset_after, tightest}
elseif reset_after ~= longest then
  return {remaining, now, 0, quota_after, reset_after}
elseif quota_after ~= limits[1] then
  return {remaining, now, 0, quota_after}
end
return {remaining, now}
