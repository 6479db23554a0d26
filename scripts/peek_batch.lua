#!lua flags=allow-cross-slot-keys,no-writes
-- peek_batch.lua: several peeks in one call (group commit), each exactly as peek.lua takes it.
--
-- The first line is the script's flags (a shebang, Valkey 7 and later): allow-cross-slot-keys
-- lets one call reach keys of several slots of one node (the engine's batches in a cluster);
-- no-writes lets it run where writes are refused (a read-only replica, EVALSHA_RO), and under
-- maxmemory.
--
-- Read-only (runs as EVALSHA_RO, so replicas may serve it).
--
-- KEYS[i]  the log of peek i: as decide_batch.lua's KEYS, declared or in ARGV
-- ARGV     as decide_batch.lua's
--
-- Reply: as decide_batch.lua's, with peek.lua's decisions.

-- include: lib_keys.lua
-- include: lib_sets.lua
-- include: lib_request.lua
-- include: lib_reply.lua
-- include: lib_batch.lua
-- include: lib_log.lua
-- include: lib_busy_elements.lua
-- include: lib_busy.lua
-- include: lib_peek.lua

return run_batch(peek_request)
