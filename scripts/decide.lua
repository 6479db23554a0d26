-- decide.lua: one atomic decision for one key against one or more limits.
--
-- Trims the entries that left the key's horizon, counts every window, adds one entry of cost
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
-- Reply: one decision, as lib_reply.lua encodes it: {server's now or 0, c, c values}. A key
-- that holds anything but a log of a layout this release knows is an error reply BADLAYOUT
-- (lib_log.lua), and nothing is written.
--
-- The common path (one limit, the server's clock, a log of up to 32 live entries) makes four
-- server calls: TIME, LINDEX (the header, which holds the newest entries), LSET (the header
-- with the new entry), PEXPIRE. A bigger log adds an LRANGE of its oldest entries when some
-- leave the window, and now and then an RPUSH or an LTRIM.

-- include: lib_request.lua
-- include: lib_reply.lua
-- include: lib_log.lua
-- include: lib_decide.lua

local now, n, limits, server_now = read_request()
return {server_now, encode_decision(limits, decide_request(KEYS[1], now, n, limits))}
