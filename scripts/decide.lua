-- decide.lua: one atomic decision for one key against one or more limits.
--
-- Trims the entries that left the key's horizon, counts every window, adds one entry of cost
-- n only when every limit has room for it, and sets the key's expiry. Runs as EVALSHA; nothing
-- can interleave, so the counts are exact. The server's work does not grow with n, nor with how
-- far a lowered limit leaves the log over it: a request is one entry, each entry is trimmed
-- once, and a denial reads at most 32 entries from each end of a window to tell when the
-- request would be admitted (lib_cover.lua's covering).
--
-- KEYS[1]  the key's log (lib_log.lua: a list, its header first)
-- ARGV[1]  the request, as integers of 8 bytes each, big-endian two's complement:
--            now    in integer microseconds, or SERVER_CLOCK (2^60) to read the server's
--                   clock (TIME)
--            n      the request's cost in events, all or nothing (1 <= n <= every max;
--                   a charge's may be more)
--            then the limits: per sliding limit, windows strictly ascending, its window in
--            integer microseconds (>= 1000) and its max, the events admitted in any
--            trailing window (>= 1); before them, optionally, -4 and 0 (a charge: the n
--            events are recorded whatever the limits say, lib_general.lua's decide; the
--            reply then carries the entry's seq even when it denies, and a denial's
--            retry_after is the wait until one event has room), optionally -3 and a hold in microseconds
--            (a reservation: the entry is recorded at now + hold, lib_general.lua's decide), and
--            optionally -1 and the resolution in microseconds (entries are recorded at the
--            end of their slot: lib_general.lua's decide); after them, per calendar limit, -2, its max, then four times in
--            microseconds, strictly ascending: the start of the period before the current
--            one, the current one's start and end, and the next one's end, as the engine's
--            clock sees them (the server's now picks the period that holds it)
--          (One string, read by one struct.unpack: each further argument, and each tonumber,
--          cost the server about as much as a tenth of a server call.)
-- or, for tools that cannot send bytes (valkey-benchmark, valkey-cli), the same in decimal,
-- one value per argument, now "" for the server's clock:
-- ARGV[1]  now or "", ARGV[2] n, ARGV[3] the first window, ARGV[4] its max, ... 
--
-- Reply: one string, as lib_reply.lua encodes it: the server's now or 0, then the decision. A
-- key that holds anything but a log of a layout this release knows is an error reply
-- BADLAYOUT (lib_log.lua), and nothing is written.
--
-- The common path (one limit, a log of up to 32 live entries: lib_small.lua) makes four
-- server calls: TIME, LINDEX (the header, which holds the newest entries), LSET (the header
-- with the new entry), PEXPIRE; three when the small header keeps the key's expiry. A
-- busy key (one limit, a longer log: lib_busy.lua) adds an LRANGE of its oldest entries when
-- some leave the window, and now and then an RPUSH or an LTRIM.

--const SERVER_CLOCK 1152921504606846976

-- include: lib_small.lua

-- The common decision first, before any other function of the script is made: one limit (the
-- request is 32 bytes, or four decimal arguments), the log small. decide_small returns nil when the request is not that
-- case, and the general path below takes it, with the clock and the header read here.
local key, request, one_limit, res = KEYS[1], ARGV[1], false, 0
local now, n, window, max
if #ARGV == 1 then
  now, n, window, max = struct.unpack('>i8i8i8i8', request)
  one_limit = #request == 32
  if #request == 48 and window == -1 then
    res = max
    window, max = struct.unpack('>i8i8', request, 33)
  end
else
  now, n, window, max = tonumber(request) or SERVER_CLOCK, tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
  one_limit = #ARGV == 4
  if #ARGV == 6 and window == -1 then
    res, window, max = max, tonumber(ARGV[5]), tonumber(ARGV[6])
  end
end
local server_now = 0
if now == SERVER_CLOCK then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
  server_now = now
end
local h = redis.pcall('LINDEX', key, 0)
-- A busy header ('K', at least 79 bytes) goes straight to the busy path:
-- decide_small would unpack its fields only to decline it (3,000 of a busy admission's 92,000
-- instructions on callgrind). The length first, so that a short header (a small log of up to 5
-- entries, most keys) or none pays no call for the test.
if one_limit and (not h or #h < 79 or string.byte(h) ~= KIND_K) then
  local remaining, retry_after, quota_after, reset_after, tightest, seq = decide_small(key, h, now, n, window, max, server_now ~= 0)
  if remaining ~= nil then
    -- lib_reply.lua's encoding, written out for the common replies: admitted as the first
    -- entry of its microsecond ({3, remaining, 0, quota_after}, or {1, remaining} when its
    -- quota comes back a window from now), else every value.
    if retry_after == 0 and seq == 1 then
      if quota_after == window then
        return struct.pack('>i8Bi8', server_now, 1, remaining)
      end
      return struct.pack('>i8Bi8i8i8', server_now, 3, remaining, 0, quota_after)
    end
    return struct.pack('>i8Bi8i8i8i8i8i8', server_now, 6, remaining, retry_after, quota_after, reset_after, tightest, seq)
  end
end

-- include: lib_busy_elements.lua
-- include: lib_busy.lua

if one_limit then
  -- One limit on a busy key (lib_busy.lua), encoded as above. (Written out twice on purpose:
  -- a function both share costs the small decision 1,400 instructions a call, 2 %.)
  local remaining, retry_after, quota_after, reset_after, tightest, seq = decide_busy(key, h, now, n, window, max, server_now ~= 0)
  if remaining ~= nil then
    if retry_after == 0 and seq == 1 then
      if quota_after == window then
        return struct.pack('>i8Bi8', server_now, 1, remaining)
      end
      return struct.pack('>i8Bi8i8i8', server_now, 3, remaining, 0, quota_after)
    end
    return struct.pack('>i8Bi8i8i8i8i8i8', server_now, 6, remaining, retry_after, quota_after, reset_after, tightest, seq)
  end
end

-- include: lib_slot.lua

if res > 0 then
  -- One limit with a resolution, its slot's entry the newest: merge_small, in full (its quota
  -- and reset are no window, so every value goes in the reply).
  local remaining, retry_after, quota_after, reset_after, tightest, seq = merge_small(key, h, now, n, res, window, max, server_now ~= 0)
  if remaining == nil then
    -- A busy key's slot (lib_busy.lua).
    remaining, retry_after, quota_after, reset_after, tightest, seq = decide_busy(key, h, now, n, window, max, server_now ~= 0, res)
  end
  if remaining ~= nil then
    return struct.pack('>i8Bi8i8i8i8i8i8', server_now, 6, remaining, retry_after, quota_after, reset_after, tightest, seq)
  end
end

-- include: lib_reply.lua
-- include: lib_log.lua
-- include: lib_decide.lua

local limits = {}
if #ARGV == 1 then
  for p = 17, #request, 8 do
    limits[#limits + 1] = struct.unpack('>i8', request, p)
  end
else
  for i = 3, #ARGV do
    limits[i - 2] = tonumber(ARGV[i])
  end
end
return struct.pack('>i8', server_now) .. encode_decision(limits, decide_request(key, now, n, limits, server_now ~= 0, h))
