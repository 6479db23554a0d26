-- peek.lua: the decision decide.lua would take, without recording it.
--
-- Read-only (runs as EVALSHA_RO, so replicas may serve it): it neither trims nor adds nor
-- moves the log's cursors; it counts from them, skipping the entries that have left.
--
-- KEYS[1]  the key's log, as in decide.lua
-- ARGV     as decide.lua's: now, n, then (window, max) pairs, windows ascending, in one
--          string of 8-byte integers or in decimal arguments
--
-- Reply: one string, as lib_reply.lua encodes it (the server's now or 0, then the decision),
-- where remaining is the room now (nothing is recorded) and seq is left at its default;
-- BADLAYOUT as in decide.lua.

-- include: lib_request.lua
-- include: lib_reply.lua
-- include: lib_log.lua
-- include: lib_busy_elements.lua
-- include: lib_busy.lua
-- include: lib_peek.lua

local now, n, limits, server_now = read_request()
return struct.pack('>i8', server_now) .. encode_decision(limits, peek_request(KEYS[1], now, n, limits))
