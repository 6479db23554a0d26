-- peek.lua: the decision decide.lua would take, without recording it.
--
-- Read-only (runs as EVALSHA_RO, so replicas may serve it): it neither trims nor adds nor
-- moves the log's cursors; it counts from them, skipping the entries that have left.
--
-- KEYS[1]  the key's log, as in decide.lua
-- ARGV     as decide.lua's: now or "", n, then (window, max) pairs, windows ascending
--
-- Reply: an array of 6 integers, shaped as decide.lua's
--   [1] remaining: the least room, over the limits, now (nothing is recorded) (>= 0)
--   [2] now in microseconds: the instant the decision was taken at
--   [3] retry_after in microseconds: 0 when n would be admitted; else (> 0) the wait until
--       every limit would have room for n
--   [4] quota_after in microseconds: the wait until the first event in the window of the
--       limit [1] speaks for leaves it; 0 when that window holds none
--   [5] reset_after in microseconds: the wait until the log holds no event; 0 when it holds
--       none now
--   [6] tightest: the 1-based position of the limit [1] speaks for

-- include: lib_request.lua
-- include: lib_log.lua
-- include: lib_peek.lua

local now, n, limits = read_request()
local remaining, _, retry_after, quota_after, reset_after, tightest = peek_request(KEYS[1], now, n, limits)
return {remaining, now, retry_after, quota_after, reset_after, tightest}
