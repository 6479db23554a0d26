-- lib_small.lua: a part included by decide.lua and decide_batch.lua (not a script of its own):
-- the decision most traffic takes, on its own so that decide.lua can take it before any other
-- function of the script is made (lib_log.lua, Speed: EVALSHA makes every function anew on
-- each call). It uses no other function of the scripts, and no local of theirs.
--
-- decide_small is decide for the common case, without making a log: a write against one
-- limit (window, max), on a log whose live entries all sit in the header's open chunk (a
-- small header, 'V': at most 32 entries, no cursors, nothing gone, no refunded run and no cost
-- above 253), by a request of n <= 253 events at or after its
-- newest entry. h is the key's header as read_header reads it; server_clock says whether now is
-- the server's clock (true) or a caller's. It returns nil, having written nothing, when the case
-- is not that one, and the caller runs decide; else a decision in lib_reply.lua's order
-- (remaining, retry_after, quota_after, reset_after, tightest, seq), the entry recorded when
-- admitted and the key's expiry set.
--
-- decide_small writes a small header ('V'), which keeps the key's expiry when the decision is
-- on the server's clock. EXPIRY_SLACK_MAX bounds how far beyond its need such a write sets the
-- key's expiry: an hour, in microseconds.
--const EXPIRY_SLACK_MAX 3600000000
--
-- What a call costs is counted here in server calls, library calls and values made (measured
-- on callgrind, each costs about as much as 10 to 50 lines of plain Lua): one struct.unpack
-- reads the header, one more each entry read (an entry of cost below 254 is 8 bytes: 7 of
-- time, 1 of cost), and one struct.pack writes the new header whole.
local function decide_small(key, h, now, n, window, max, server_clock)
  local total, count, newest, seq, horizon, first, expires = 0, 0, NO_TIME_BEFORE, 0, 0, 1, 0
  if h then
    -- A table (the key holds another type) has length 0, as has no header.
    if #h < 43 then
      return nil
    end
    local kind
    kind, total, count, newest, seq, horizon, expires, first = struct.unpack('>Bi7i7i7i7i7i7', h)
    if kind ~= KIND_V then
      return nil
    end
  else
    h = ''
  end
  -- A longer window counted on this key keeps entries this one does not count: general().
  -- So does a header whose open chunk is not count entries long (8 to 12 bytes each), which
  -- the general path refuses when it is no log's (lib_header.lua): the entries read below
  -- stay within the header.
  local chunk = #h - first + 1
  if now < newest or count > OPEN_CHUNK_MAX or horizon > window or n >= 254 or chunk < 8 * count or chunk > 12 * count then
    return nil
  end
  -- Trim: the entries at or before cutoff leave, from the front of the open chunk. A header
  -- that does not hold this window as its horizon yet is written, denied or not.
  local cutoff, t, cost, p, lead, lead_cost, changed = now - window, 0, 0, first, now, 0, horizon < window
  if count > 0 and newest <= cutoff then
    first, total, count, changed = #h + 1, 0, 0, true
  else
    while count > 0 do
      t, cost, p = struct.unpack('>i7B', h, first)
      if cost >= 254 then
        return nil
      end
      if t > cutoff then
        lead, lead_cost = t, cost
        break
      end
      first, total, count, changed = p, total - cost, count - 1, true
    end
  end
  if total + n > max then
    -- Denied: the events that must leave, from the oldest on, and the entry that takes them;
    -- the first entry with events is the first to give quota back.
    local need, quota_at = total + n - max, nil
    p = first
    while need > 0 do
      if p > #h then
        return nil -- a total its entries do not hold: the general path refuses the key
      end
      t, cost, p = struct.unpack('>i7B', h, p)
      if cost >= 254 then
        return nil
      end
      need = need - cost
      if quota_at == nil and cost > 0 then
        quota_at = t
      end
    end
    if changed then
      if horizon < window then
        -- The key now keeps this longer window: its entries must outlive the expiry a
        -- shorter one set. Set without knowing expires, which the header then drops.
        if server_clock then
          redis.call('PEXPIREAT', key, math.ceil((newest + window) / 1000))
        else
          redis.call('PEXPIRE', key, math.ceil((newest + window - now) / 1000) + RELATIVE_EXPIRY_SLACK_MS)
        end
        expires = 0
      end
      redis.call('LSET', key, 0, struct.pack('>Bi7i7i7i7i7i7c0', KIND_V, total, count, newest, seq, window, expires, string.sub(h, first)))
    end
    local remaining = max - total
    if remaining < 0 then
      remaining = 0
    end
    return remaining, t + window - now, quota_at + window - now, newest + window - now, 1, 1
  end
  -- Admitted. A full open chunk that nothing left takes the general path, which closes it; one
  -- that trimmed an entry holds the new one (a log at the chunk's size stays small while its
  -- traffic is steady). Nothing is written yet.
  if count >= OPEN_CHUNK_MAX then
    return nil
  end
  -- The first live entry with events leaves first (every entry is at or before now); without
  -- one, the new entry.
  if total > 0 and lead_cost == 0 then
    p = first
    repeat
      if p > #h then
        return nil
      end
      lead, lead_cost, p = struct.unpack('>i7B', h, p)
      if lead_cost >= 254 then
        return nil
      end
    until lead_cost > 0
  elseif total == 0 then
    lead = now
  end
  if count > 0 and now == newest then
    seq = seq + 1
  else
    seq = 1
  end
  -- The expiry: the key must last until the new entry leaves the window, now + window (as
  -- keep_log_until in lib_log.lua sets it). On the server's clock, an expires that reaches
  -- that far means no call; else PEXPIREAT sets it further by the slack (the window, at most
  -- EXPIRY_SLACK_MAX), and the header keeps it. On a caller's clock PEXPIRE sets it with its
  -- slack, and the header claims none (expires 0). Whole milliseconds, rounded up (x + 999 - (x + 999) % 1000 is math.ceil's
  -- work in three operations, not a call).
  local command, at = nil, now + window + 999
  if not server_clock then
    at = window + 999
    expires, command, at = 0, 'PEXPIRE', (at - at % 1000) / 1000 + RELATIVE_EXPIRY_SLACK_MS
  elseif expires * 1000 < now + window then
    local slack = window
    if slack > EXPIRY_SLACK_MAX then
      slack = EXPIRY_SLACK_MAX
    end
    at = at + slack
    expires = (at - at % 1000) / 1000
    command, at = 'PEXPIREAT', expires
  end
  -- The header, with the entries left and the new one after them.
  local header = struct.pack('>Bi7i7i7i7i7i7c0i7B', KIND_V, total + n, count + 1, now, seq, window, expires, string.sub(h, first), now, n)
  if #h > 0 then
    -- The expiry before the entry: a server that refuses it refuses before anything is
    -- recorded.
    if command then
      redis.call(command, key, at)
    end
    local set = redis.pcall('LSET', key, 0, header)
    if type(set) == 'table' and set.err then
      -- Over maxmemory (noeviction) the server refuses a script's first write that may grow
      -- memory, but not one that follows a write: a decision that sets no expiry sets the one
      -- its header keeps (which changes nothing), and the header goes in, as when it sets one.
      if command ~= nil or string.sub(set.err, 1, 4) ~= 'OOM ' then
        error(set)
      end
      redis.call('PEXPIREAT', key, expires)
      redis.call('LSET', key, 0, header)
    end
  else
    -- A key this call made: without its expiry it would outlive every window. Refused, the
    -- key goes again, and the call records nothing.
    redis.call('RPUSH', key, header)
    local ok, err = pcall(redis.call, command, key, at)
    if not ok then
      redis.call('DEL', key)
      error(err)
    end
  end
  return max - total - n, 0, lead + window - now, window, 1, seq
end
