-- lib_request.lua: a part included by the decision scripts (not a script of its own).
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

-- read_request reads the decision scripts' ARGV (decide.lua documents it): it returns now, the
-- request's cost n, the limits as a flat list of (window, max) pairs with windows ascending,
-- and now again when it is the server's clock, else 0 (the reply's first value).
local function read_request()
  local limits = {}
  for i = 3, #ARGV do
    limits[i - 2] = tonumber(ARGV[i])
  end
  local now, from_server = read_clock(ARGV[1])
  local server_now = 0
  if from_server then
    server_now = now
  end
  return now, tonumber(ARGV[2]), limits, server_now
end
