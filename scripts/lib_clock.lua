-- lib_clock.lua: a part included by the decision scripts (not a script of its own).
--
-- read_clock(arg) returns now in integer microseconds and whether it came from the server:
-- the caller's time when arg is a number, else the server's clock (TIME), which every process
-- that shares a key then shares.
local function read_clock(arg)
  local now = tonumber(arg)
  if now ~= nil then
    return now, false
  end
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2], true
end
