-- inspect.lua: a key's log as it is stored, for operators and tests.
--
-- Read-only (runs as EVALSHA_RO). It decodes the log with the same code the other scripts use.
--
-- KEYS[1]  the key's log, as in decide.lua
-- ARGV[1]  the most entries to return, newest last (0: all)
--
-- Reply: an array of integers: total (events in the log), count (entries), the newest entry's
-- time and seq, cursors (how many shorter windows the log keeps a cursor for), then a time and
-- a cost per entry returned, oldest first. An absent key replies total 0 and count 0.

-- include: lib_log.lua

local g = general()
local log = g.read_log(KEYS[1], read_header(KEYS[1]), false)
local reply = {log.total, log.count, log.newest, log.seq, #log.cursors}
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
