-- lib_request.lua: a part included by the decision scripts other than decide.lua (not a script
-- of its own).
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

-- read_request reads a single decision script's ARGV (decide.lua documents it: one string of
-- 8-byte integers, now or SERVER_CLOCK, n, then (window, max) pairs; or the same in decimal,
-- one per argument, now "" for the server's clock): it returns now, the request's
-- cost n, the limits as a flat list of (window, max) pairs with windows ascending, and now
-- again when it is the server's clock, else 0 (the reply's first value).
--
--const SERVER_CLOCK 1152921504606846976
local function read_request()
  local request, limits, now, n = ARGV[1], {}, nil, 0
  if #ARGV == 1 then
    now, n = struct.unpack('>i8i8', request)
    if now == SERVER_CLOCK then
      now = nil
    end
    for p = 17, #request, 8 do
      limits[#limits + 1] = struct.unpack('>i8', request, p)
    end
  else
    now, n = request, tonumber(ARGV[2])
    for i = 3, #ARGV do
      limits[i - 2] = tonumber(ARGV[i])
    end
  end
  local from_server
  now, from_server = read_clock(now)
  if from_server then
    return now, n, limits, now
  end
  return now, n, limits, 0
end
