-- lib_peek.lua: a part included by peek.lua and peek_batch.lua (not a script of its own).
--
-- peek_request is decide_request without recording or writing anything; its reset_after is 0
-- when the longest window holds no event, and its quota_after 0 when the tightest one holds
-- none. Its arguments are decide_request's, so that run_batch takes either: the fifth, whether
-- now is the server's clock, does not bear on a peek; h is the key's header when the caller has
-- read it (read_header), nil else. The common peek (one limit, a log whose entries all sit in a small header) is
-- peek_small, on the header string alone; the rest goes through general(), whose log costs
-- the server three times as much to make.
-- peek_small is the read-only decision of one limit on a small header h (read_header's reply:
-- a string of kind V or U, or false for no key), counting the entries after now - window
-- without trimming any: it returns remaining, retry_after, quota_after and reset_after as
-- peek_request does, or nil when h is not such a header.
local function peek_small(h, now, n, window, max)
  if not h then
    return max, 0, 0, 0
  elseif type(h) == 'table' then
    return nil
  end
  local kind, total, count, newest, seq, horizon, pos = string.byte(h, 1), 0, 0, 0, 0, 0, 0
  if (kind == KIND_V or kind == KIND_U) and #h >= 43 then
    total, count, newest, seq, horizon, pos = struct.unpack('>i7i7i7i7i7', h, 2)
    pos = pos + 7 -- expires
  else
    return nil
  end
  -- Fields no log's header holds, or an open chunk not count entries long (8 to 12 bytes
  -- each): the general path, which refuses a header that is no log's (lib_header.lua).
  local chunk = #h - pos + 1
  if total < 0 or total > MAX_COUNT or count < 0 or count > OPEN_CHUNK_MAX + 1 or horizon < 0 or horizon > MAX_WINDOW
    or newest ~= NO_TIME_BEFORE and (newest <= -MAX_TIME or newest >= MAX_TIME) or chunk < 8 * count or chunk > 12 * count then
    return nil
  end
  -- The entries at or before cutoff have left this window (a longer one may still count them).
  local cutoff = now - window
  while count > 0 do
    local t, cost, next_pos = read_entry(h, pos)
    if t > cutoff then
      break
    end
    pos, total, count = next_pos, total - cost, count - 1
  end
  if total == 0 then
    return max, 0, 0, 0
  end
  -- The first entry with events leaves first; when denied, the entry that takes enough of
  -- them out of the window is the wait.
  local need, retry_after, quota_after = total + n - max, 0, nil
  local p, t, cost = pos, 0, 0
  repeat
    t, cost, p = read_entry(h, p)
    if cost > 0 and quota_after == nil then
      quota_after = t + window - now
    end
    need = need - cost
  until need <= 0 and quota_after ~= nil
  if total + n > max then
    retry_after = t + window - now
  end
  return math.max(max - total, 0), retry_after, quota_after, newest + math.max(window, horizon) - now
end

-- peek_busy is peek_small for a busy key (lib_busy.lua): the same results, read without
-- writing anything; nil when the busy path does not take the peek.
local function peek_busy(key, h, now, n, window, max)
  local kind, total, _, newest, _, gone, closed, oldest, oldest_cost, last_weighted, p, _, first, cs, cf, cn = busy_read(key, h, now, window)
  if kind == nil then
    return nil
  elseif total == 0 then
    return max, 0, 0, 0
  end
  local retry_after = 0
  if total + n > max then
    local t = busy_cover(key, h, p, gone, closed, oldest, oldest_cost, last_weighted, cs, cf, cn, total, total + n - max)
    if t == nil then
      return nil
    end
    retry_after = t + window - now
  end
  local remaining = max - total
  if remaining < 0 then
    remaining = 0
  end
  return remaining, retry_after, first + window - now, newest + window - now
end

-- one_limit is the window and max of limits when they are one limit, with or without a
-- resolution (-1, res before its pair: a resolution changes where an entry is recorded, not
-- how the window counts), which peek_small can peek on a small header; else nil.
local function one_limit(limits)
  if #limits == 2 then
    return limits[1], limits[2]
  elseif #limits == 4 and limits[1] == -1 then
    return limits[3], limits[4]
  end
  return nil
end

local function peek_request(key, now, n, limits, _, h)
  if h == nil then
    h = read_header(key)
  end
  local window, max = one_limit(limits)
  if window ~= nil then
    -- A header whose entries do not fill it as it says fails its decoding here (peek_small
    -- reads what it is told): the general path refuses it (lib_header.lua).
    local ok, remaining, retry_after, quota_after, reset_after = pcall(peek_small, h, now, n, window, max)
    if not ok then
      remaining = nil
    end
    if remaining == nil then
      remaining, retry_after, quota_after, reset_after = peek_busy(key, h, now, n, window, max)
    end
    if remaining ~= nil then
      return remaining, retry_after, quota_after, reset_after, 1, 1
    end
  end
  local g = general()
  local log = g.read_log(key, h)
  local remaining, tightest, retry_after, count, _, quota_after = g.decide(log, now, n, limits, false)
  local sliding = g.view(limits)
  local reach = log.horizon
  if #sliding > 0 and sliding[#sliding - 1] > reach then
    reach = sliding[#sliding - 1]
  end
  local reset_after = 0
  if count > 0 or #log.counters > 0 then
    reset_after = math.max(g.reset_at(log, reach) - now, 0)
  end
  return remaining, retry_after, quota_after, reset_after, tightest, 1
end
