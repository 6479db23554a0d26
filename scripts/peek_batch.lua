-- peek_batch.lua: several peeks in one call (group commit), each exactly as peek.lua takes it.
--
-- Read-only (runs as EVALSHA_RO, so replicas may serve it).
--
-- KEYS[i]  the log of peek i (in a cluster, every key of one call is in one slot)
-- ARGV     as decide_batch.lua's
--
-- Reply: as decide_batch.lua's, with peek.lua's decisions.

-- include: lib_request.lua
-- include: lib_reply.lua
-- include: lib_batch.lua
-- include: lib_log.lua
-- include: lib_peek.lua

return run_batch(peek_request)
