-- lib_reply.lua: a part included by the decision scripts (not a script of its own): the one
-- encoding of decisions in a reply, shared by decide.lua, peek.lua and their batch scripts.
--
-- A decision is one string: a byte c (1 to 6), then c values, each 8 bytes, big-endian two's
-- complement, in this order:
--
--   remaining    the least, over the limits, of the events that would still be admitted now,
--                after this decision (>= 0)
--   retry_after  microseconds; 0 when admitted; when denied (always > 0), the wait until every
--                limit has room for the request: per denying limit, until the entry that
--                brings enough events out of its window leaves it
--   quota_after  microseconds until the first event in the window of the limit remaining
--                speaks for (after this decision) leaves it: when that limit next gets quota
--                back; 0 for a peek when that window holds no event
--   reset_after  microseconds until the log holds no event: its newest entry plus the key's
--                horizon; 0 for a peek when the log holds none
--   tightest     the 1-based position, in the request's limits (windows ascending), of the
--                limit remaining speaks for: the least room, the shortest window among equals
--   seq          when admitted, the entry's position among the key's entries of its
--                microsecond: its identity, with its time, for refunds
--
-- Trailing values equal to their defaults are left out: retry_after 0, quota_after the window
-- of the limit at position tightest, reset_after the longest of the request's windows,
-- tightest 1, seq 1.
--
-- A single script (decide.lua, peek.lua) replies with one string: the server's now in integer
-- microseconds (0 when the call did not read the server's clock: the request carried its own
-- now), 8 bytes as above, then the decision. A batch script replies with an array: the
-- server's now as an integer, then per request in KEYS order its decision, or an error reply
-- (that request failed, alone).
--
-- Why a string: the server turns a script's reply into the protocol value by value, and each
-- element of an array, with the table that holds it, cost about as much as a server call's
-- share of a decision (measured on callgrind: 1,000 instructions per element); one string is
-- one value, and struct.pack makes it in one call. The common admission replies 17 bytes
-- after the now: {3, remaining, 0, quota_after}.

-- encode_decision returns one request's decision, encoded as above. limits are the request's
-- flat limits (decide.lua): (window, max) pairs, windows ascending, or, when the general path
-- read them (lib_general.lua's view), with their sliding pairs apart, whose longest window is
-- reset_after's default.
local function encode_decision(limits, remaining, retry_after, quota_after, reset_after, tightest, seq)
  if seq ~= 1 then
    return struct.pack('>Bi8i8i8i8i8i8', 6, remaining, retry_after, quota_after, reset_after, tightest, seq)
  elseif tightest ~= 1 then
    return struct.pack('>Bi8i8i8i8i8', 5, remaining, retry_after, quota_after, reset_after, tightest)
  elseif reset_after ~= (limits.sliding or limits)[#(limits.sliding or limits) - 1] then
    return struct.pack('>Bi8i8i8i8', 4, remaining, retry_after, quota_after, reset_after)
  elseif quota_after ~= limits[1] then
    return struct.pack('>Bi8i8i8', 3, remaining, retry_after, quota_after)
  elseif retry_after ~= 0 then
    return struct.pack('>Bi8i8', 2, remaining, retry_after)
  end
  return struct.pack('>Bi8', 1, remaining)
end
