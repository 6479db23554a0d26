-- lib_slot.lua: a part included by decide.lua and decide_batch.lua (not a script of its own):
-- the decision most admissions of a limit with a resolution take (lib_log.lua, Slots), on its
-- own so that decide.lua makes it only for such a request, after the common decision of
-- lib_small.lua has passed. Like decide_small, it uses no other function of the scripts.

-- write_slot ends an admission of merge_small: it sets the expiry the newest entry, of time
-- newest, needs (as keep_log_until in lib_log.lua does), then writes header; and returns the
-- decision, whose quota comes back when the first entry with events, of time first, leaves
-- the window (within it at the latest: the new events are in it too).
local function write_slot(key, header, now, newest, first, window, server_clock, remaining, seq)
  if server_clock then
    local ms = newest + window + 999
    redis.call('PEXPIREAT', key, (ms - ms % 1000) / 1000)
  else
    local ms = newest + window - now + 999
    redis.call('PEXPIRE', key, (ms - ms % 1000) / 1000 + RELATIVE_EXPIRY_SLACK_MS)
  end
  redis.call('LSET', key, 0, header)
  local quota_after = first + window - now
  if quota_after > window then
    quota_after = window
  end
  return remaining, 0, quota_after, newest + window - now, 1, seq
end

-- merge_small is the common decision of a limit with a resolution res (lib_log.lua, Slots),
-- without making a log, on a log that holds this window as its horizon: an admission whose
-- slot's entry is the newest entry, at the end of the header's open chunk ('V', or 'K'
-- without cursors), none of whose entries has left the window, so that nothing is trimmed: the
-- new cost is added to that entry in place, and the header rewritten; or an admission of a
-- new slot on a small log ('V', fewer than 32 entries), whose entries that
-- left the window are dropped from the front and the slot's entry appended. It returns nil,
-- having written nothing, in every other case (a denial, a big log's new slot or trim), and
-- the general path takes the request; else a decision as decide_small's.
local function merge_small(key, h, now, n, res, window, max, server_clock)
  if not h or #h < 51 then
    return nil
  end
  local kind, total, count, newest, seq, horizon, pos = struct.unpack('>Bi7i7i7i7i7', h)
  local first_t, first_cost
  if kind == KIND_K and #h >= 87 then
    local gone, closed, oldest, oldest_cost, ncursors
    gone, closed, oldest, oldest_cost, ncursors, pos = struct.unpack('>i7i7i7i7i7', h, pos)
    -- Fields no log's header holds: the general path, which refuses it (lib_header.lua).
    if ncursors ~= 0 or closed <= 0 or closed > count or gone < 0 or total < 0 or total > MAX_COUNT
      or oldest <= -MAX_TIME or oldest >= MAX_TIME or newest <= -MAX_TIME or newest >= MAX_TIME
      or string.byte(h, pos + 7) > HEAD_CACHE then
      return nil
    end
    -- last_weighted, which the merged entry (of cost 2 or more) moves to newest, and the head
    -- cache, which it leaves as it is: the open chunk follows.
    pos = pos + 8 + 8 * string.byte(h, pos + 7)
    first_t, first_cost = oldest, oldest_cost
  elseif kind == KIND_V then
    pos = pos + 7 -- expires: a merge sets the expiry its entry needs, and claims none
    -- Every entry read below stays within the header, or the general path takes the request
    -- (and refuses a key whose header is no log's: lib_header.lua).
    local chunk = #h - pos + 1
    if count < 1 or chunk < 8 * count or chunk > 12 * count then
      return nil
    end
    first_t, first_cost = struct.unpack('>i7B', h, pos)
    if first_cost >= 254 and pos + (first_cost == 254 and 9 or 11) > #h then
      return nil
    end
    if first_cost == 254 then
      first_cost = struct.unpack('>I2', h, pos + 8)
      if first_cost < 254 then
        first_cost = 0 -- a refunded run
      end
    elseif first_cost == 255 then
      first_cost = struct.unpack('>I4', h, pos + 8)
      if first_cost < 65536 then
        first_cost = 0
      end
    end
  else
    return nil
  end
  local t = now - now % res
  if t < now then
    t = t + res
  end
  if kind == KIND_V and t > newest and horizon == window and count < OPEN_CHUNK_MAX and n < 254 then
    -- A new slot on a small log: trim the entries that left the window from the front of the
    -- open chunk, and append the slot's entry.
    local cutoff, p, lead = now - window, pos, nil
    while count > 0 do
      if p + 7 > #h then
        return nil
      end
      local et, c = struct.unpack('>i7B', h, p)
      local size = 8
      if c >= 254 and p + (c == 254 and 9 or 11) > #h then
        return nil
      end
      if c == 254 then
        c, size = struct.unpack('>I2', h, p + 8), 10
        if c < 254 then
          return nil -- a refunded run
        end
      elseif c == 255 then
        c, size = struct.unpack('>I4', h, p + 8), 12
        if c < 65536 then
          return nil
        end
      end
      if et > cutoff then
        if c == 0 then
          return nil -- the general path finds the first entry with events
        end
        lead = et
        break
      end
      p, total, count = p + size, total - c, count - 1
    end
    if total + n > max then
      return nil
    end
    return write_slot(key, struct.pack('>Bi7i7i7i7i7i7c0i7B', KIND_V, total + n, count + 1, t, 1, window, 0, string.sub(h, p), t, n),
      now, t, lead or t, window, server_clock, max - total - n, 1)
  end
  if t ~= newest or horizon ~= window or first_t <= now - window or first_cost == 0 or total + n > max then
    return nil
  end
  -- The newest entry ends the header: 8 bytes (cost below 254), 10 (254, then 2 bytes) or 12
  -- (255, then 4). Exactly one of the three must read as an entry of time newest.
  local at, cost = nil, 0
  for _, size in ipairs({8, 10, 12}) do
    local p = #h - size + 1
    if p >= pos then
      local et, b = struct.unpack('>i7B', h, p)
      local c = nil
      if et == newest then
        if size == 8 and b < 254 then
          c = b
        elseif size == 10 and b == 254 then
          c = struct.unpack('>I2', h, p + 8)
          if c < 254 then
            c = nil
          end
        elseif size == 12 and b == 255 then
          c = struct.unpack('>I4', h, p + 8)
          if c < 65536 then
            c = nil
          end
        end
      end
      if c ~= nil then
        if at ~= nil then
          return nil
        end
        at, cost = p, c
      end
    end
  end
  if at == nil or cost == 0 or cost + n > 2147483647 then
    return nil
  end
  cost = cost + n
  local entry
  if cost < 254 then
    entry = struct.pack('>i7B', newest, cost)
  elseif cost < 65536 then
    entry = struct.pack('>i7BI2', newest, 254, cost)
  else
    entry = struct.pack('>i7BI4', newest, 255, cost)
  end
  local header = struct.pack('>Bi7', kind, total + n) .. string.sub(h, 9, at - 1) .. entry
  if kind == KIND_K then
    header = string.sub(header, 1, 71) .. struct.pack('>i7', newest) .. string.sub(header, 79)
  else
    header = string.sub(header, 1, 36) .. struct.pack('>i7', 0) .. string.sub(header, 44)
  end
  return write_slot(key, header, now, newest, first_t, window, server_clock, max - total - n, seq)
end
