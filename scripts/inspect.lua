-- inspect.lua: a key's log as it is stored, for operators and tests.
--
-- Read-only (runs as EVALSHA_RO). It decodes the log with the same code the other scripts use.
--
-- KEYS[1]  the key's log, as in decide.lua
-- ARGV[1]  the most entries to return, newest last (0: all)
--
-- Reply: an array of integers: total (events in the log), count (entries), layout (the version
-- of the layout the header was written in, lib_log.lua's LAYOUT; 0 for an absent key), cursors (how
-- many shorter windows the log keeps a cursor for), counters (how many calendar counters it
-- keeps), then per counter its period's start and end and its events, then a time and a
-- cost per entry returned, oldest first. An absent key replies total 0 and count 0; BADLAYOUT as in
-- decide.lua.

-- include: lib_log.lua

-- layout_version is the layout version (lib_log.lua) of a header read_log accepted
-- (lib_header.lua): LAYOUT, the one this release reads; 0 for none.
local function layout_version(h)
  if not h then
    return 0
  end
  return LAYOUT
end

local g = general()
local h = read_header(KEYS[1])
local log = g.read_log(KEYS[1], h)
local reply = {log.total, log.count, layout_version(h), #log.cursors, #log.counters}
for _, c in ipairs(log.counters) do
  reply[#reply + 1] = c.start
  reply[#reply + 1] = c.stop
  reply[#reply + 1] = c.events
end
local from = 0
local most = tonumber(ARGV[1])
if most > 0 and log.count > most then
  from = log.count - most
end
local i = from
while i < log.count do
  local ts, cs = g.entries(log, i, i + 255)
  for j = 1, #ts do
    reply[#reply + 1] = ts[j]
    reply[#reply + 1] = cs[j]
  end
  i = i + #ts
end
return reply
