-- lib_reply.lua: a part included by the decision scripts (not a script of its own): the one
-- encoding of decisions in a reply, shared by decide.lua, peek.lua and their batch scripts.
--
-- A decision script replies with an array: first the server's now in integer microseconds
-- (0 when the call did not read the server's clock: every request carried its own now), then,
-- per request in KEYS order, either an error reply (that request failed, alone) or a count c
-- (1 to 6) and c values, in this order:
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
-- tightest 1, seq 1. The common admission replies {now, 1, remaining}.

-- encode_decision returns one request's decision, encoded as above: c, then c values. limits
-- are the request's flat (window, max) pairs, windows ascending. A single script's reply is
-- {server_now, encode_decision(...)}, which Lua builds at its exact size in one go.
local function encode_decision(limits, remaining, retry_after, quota_after, reset_after, tightest, seq)
  if seq ~= 1 then
    return 6, remaining, retry_after, quota_after, reset_after, tightest, seq
  elseif tightest ~= 1 then
    return 5, remaining, retry_after, quota_after, reset_after, tightest
  elseif reset_after ~= limits[#limits - 1] then
    return 4, remaining, retry_after, quota_after, reset_after
  elseif quota_after ~= limits[1] then
    return 3, remaining, retry_after, quota_after
  elseif retry_after ~= 0 then
    return 2, remaining, retry_after
  end
  return 1, remaining
end
