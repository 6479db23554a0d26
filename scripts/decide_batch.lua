#!lua flags=allow-cross-slot-keys
-- decide_batch.lua: several decisions in one call (group commit), each taken exactly as
-- decide.lua takes it, one after the other in KEYS order; the same key may come twice and is
-- decided twice, in order. One call's fixed cost (the script's start, reading the server's
-- clock) is shared by every decision in it.
--
-- The first line is the script's flags (a shebang, Valkey 7 and later): allow-cross-slot-keys
-- lets one call reach keys of several slots of one node (the engine's batches in a cluster);
-- without allow-oom the server refuses the whole call when over maxmemory, before it runs
-- (the engine then sends each decision alone, with decide.lua).
--
-- KEYS[i]  the log of request i: in a cluster, keys of one slot; or, of several slots of the
--          node the call goes to, passed in ARGV instead (lib_keys.lua: numkeys 0, ARGV[1]
--          their number, then the keys, then the ARGV below)
-- ARGV[1]  "" when every request uses the server's clock (read once, shared by all), else
--          "each": every request carries its own now
-- ARGV[2]  the number of limit sets S, then S sets: a set's number of values L, then its L
--          values, decide.lua's limits in decimal (as its decimal ARGV[3..])
--          ... then per request, in KEYS order: its cost n; the 1-based index of its set; with
--          "each", its now in integer microseconds, or "" for the server's clock
--
-- Reply: the decisions, as lib_reply.lua encodes them: {server's now or 0, then per request
-- its decision (a string), or an error reply for a request that failed (its key holds
-- something else: BADLAYOUT, say)}. A failed request changes nothing of the others.

-- include: lib_keys.lua
-- include: lib_sets.lua
-- include: lib_request.lua
-- include: lib_reply.lua
-- include: lib_batch.lua
-- include: lib_small.lua
-- include: lib_slot.lua
-- include: lib_busy_elements.lua
-- include: lib_busy.lua
-- include: lib_log.lua
-- include: lib_decide.lua

return run_batch(decide_request)
