-- settle.lua: lowers the cost of one admitted request's entry, or refunds it (to 0); or
-- raises an entry of its own above its admitted cost, once.
--
-- The entry is found by its identity, the time and seq decide.lua replied with. An entry of
-- its own (an exact limit's) becomes the lesser of its cost and actual, and every window it is
-- in gets the difference back at once: idempotent, settling again to the same or a higher cost
-- changes nothing, and an identity never names another request's entry (a refunded entry
-- keeps its place until it leaves). A shared entry (a Resolution slot's, which holds other
-- requests' events too) cannot tell whose events it gives back: it gives admitted - actual
-- back on every call, never below 0. The calendar counters whose period holds the request's
-- decision time get back what its entry gave, or, shared, admitted - actual (also for a
-- request of calendar limits alone, which has no entry: seq 0). A no-op once the entry has
-- left the log and its periods ended.
--
-- KEYS[1]  the key's log, as in decide.lua
-- ARGV[1]  the entry's time in integer microseconds
-- ARGV[2]  the entry's seq (>= 1; 0 for a shared request with no entry)
-- ARGV[3]  the cost the entry was admitted with (>= 1): an entry of its own at that identity
--          holding more is not this request's, and is left alone
-- ARGV[4]  actual: the cost the request ends with (0 <= actual; above ARGV[3] only for an
--          entry of its own, which is raised to actual when it still holds ARGV[3]: the
--          events it used beyond what it was admitted with are charged, whatever the limits
--          say, and a retried raise finds the entry raised and changes nothing)
-- ARGV[5]  "shared" when the request's entry is shared (or it has none), else absent or ""
-- ARGV[6]  the request's decision time in integer microseconds (absent: ARGV[1])
--
-- Reply: the events given back, an integer (0 when nothing changed; minus the events added,
-- for a raise); BADLAYOUT as in
-- decide.lua.

-- include: lib_log.lua

local key = KEYS[1]
local t = tonumber(ARGV[1])
local seq = tonumber(ARGV[2])
local admitted = tonumber(ARGV[3])
local actual = tonumber(ARGV[4])
local shared = ARGV[5] == 'shared'
local decided = tonumber(ARGV[6] or '') or t

local g = general()
-- include: lib_refund.lua

local log = g.read_log(key, read_header(key))
local back = 0
local at = nil
if seq >= 1 then
  at = g.find(log, t, seq)
end
if at ~= nil then
  local _, cost = g.entry_at(log, at)
  local left = actual
  if shared then
    left = cost - (admitted - actual)
    if left < 0 then
      left = 0
    end
  elseif actual > admitted then
    if cost ~= admitted then
      -- Raised only from the cost it was admitted with: a retried raise, or one after a
      -- Settle or a Refund, changes nothing.
      left = cost
    end
  elseif cost > admitted or actual > cost then
    -- Another request's (it holds more), or lowered already: left as it is.
    left = cost
  end
  if left > cost then
    local up = left - cost
    g.set_cost(log, at, left)
    log.total = log.total + up
    for _, c in ipairs(log.cursors) do
      if at < c.idx then
        c.partial = c.partial + up
      end
    end
    log.dirty = true
    back = -up
  elseif left < cost then
    g.set_cost(log, at, left)
    back = cost - left
    log.total = log.total - back
    for _, c in ipairs(log.cursors) do
      if at < c.idx then
        c.partial = c.partial - back
      end
    end
    log.dirty = true
    if left == 0 then
      g.compact(log, at)
    end
  end
end
if #log.counters > 0 then
  local give = back
  if shared then
    give = admitted - actual
  end
  if give > 0 and g.count_in(log, decided, -give) > 0 and back == 0 then
    back = give
  end
end
g.save(log)
return back
