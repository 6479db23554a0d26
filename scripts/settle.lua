-- settle.lua: lowers the cost of one admitted request's entry, or refunds it (to 0).
--
-- The entry is found by its identity, the time and seq decide.lua replied with; its cost
-- becomes the lesser of its cost and actual, and every window it is in gets the difference
-- back at once. Idempotent: settling again to the same or a higher cost changes nothing, and
-- an identity never names another request's entry (a refunded entry keeps its place until it
-- leaves). A no-op once the entry has left the log.
--
-- KEYS[1]  the key's log, as in decide.lua
-- ARGV[1]  the entry's time in integer microseconds
-- ARGV[2]  the entry's seq (>= 1)
-- ARGV[3]  the cost the entry was admitted with (>= 1): an entry at that identity holding
--          more is not this request's, and is left alone
-- ARGV[4]  actual: the cost the request ends with (0 <= actual <= ARGV[3])
--
-- Reply: the events given back, an integer (0 when nothing changed); BADLAYOUT as in
-- decide.lua.

-- include: lib_log.lua

local key = KEYS[1]
local t = tonumber(ARGV[1])
local seq = tonumber(ARGV[2])
local admitted = tonumber(ARGV[3])
local actual = tonumber(ARGV[4])

local g = general()
local log = g.read_log(key, read_header(key))
local at = g.find(log, t, seq)
if at == nil then
  return 0
end
local _, cost = g.entry_at(log, at)
if cost > admitted or actual >= cost then
  return 0
end
g.set_cost(log, at, actual)
local back = cost - actual
log.total = log.total - back
for _, c in ipairs(log.cursors) do
  if at < c.idx then
    c.partial = c.partial - back
  end
end
log.dirty = true
if actual == 0 then
  g.compact(log, at)
end
g.save(log)
return back
