-- lib_busy.lua: a part included by decide.lua, decide_batch.lua, decide_all.lua, peek.lua and
-- peek_batch.lua (not a script of its own): the decision of one limit on a busy key, one
-- whose log holds older entries behind its header (a full header, 'K', that keeps no cursor), on the header string and locals alone, as decide_small does
-- for a small log (lib_small.lua), so that a busy key costs about what an idle one does.
-- Included after the small decision, so that a call that takes it makes none of these
-- functions. Like decide_small, it uses no other function of the scripts but its elements'
-- (lib_busy_elements.lua, included before it).
--
-- What it reads beyond the header: the entries that left the window since the last write,
-- each once: from the header's head cache, refilled by one LRANGE every HEAD_CACHE entries,
-- and past one refill, when every entry after the window's start costs 1, only the few
-- busy_seek reads to find where it starts; and on a unit log (lib_log.lua), the one entry a
-- denial's wait is read from. What it declines (returns nil,
-- having written nothing), for the general path: a header of another kind or with cursors,
-- a log over a longer window than this limit's (its horizon), a caller's clock behind the
-- newest entry, a log whose every entry left, an entry of cost 254 or more, a refunded entry
-- where the decision needs the first entry with events, and the wait of a denial that lies
-- deep in a log whose entries' costs are unknown (weighted: the general path walks to it).
--
-- What it costs is counted in server calls and in strings made: Lua interns every string it
-- makes (hashing it), so the header is written as one concatenation of its packed fields
-- and what it keeps of the old one, in place; struct.pack's c0 copies byte by byte.

-- BUSY_OPEN_MAX is the open chunk's size at which the busy path moves it behind the header:
-- fewer entries than a small log's (OPEN_CHUNK_MAX), since every byte the header carries is
-- read and written again on every call, which costs more than an RPUSH now and then.
--const BUSY_OPEN_MAX 8

-- busy_read reads h, key's header, as the busy path takes it, at now for a limit of window,
-- for an entry to be recorded at at (now when nil; a slot's end for a limit with a resolution):
-- the header's fields, with the entries that left the window taken out (the elements behind
-- the header read as far as they left, from the head cache first; the open
-- chunk's, when every closed one left: p is then the byte of the first that stays);
-- changed when some left; first, the time of the oldest live entry with events (nil when
-- none carries any); and the head cache to write back: cn entries of
-- cs from byte cf, the oldest live closed entries in the open chunk's encoding, oldest
-- first. cs is h itself while nothing was read into it, and then the cache runs on into the
-- open chunk. It returns nil when the busy path does not take the log (see the top).
local function busy_read(key, h, now, window, at)
  if type(h) ~= 'string' or #h < 79 or string.byte(h) ~= KIND_K then
    return nil
  end
  local kind, total, count, newest, seq, horizon, gone, closed, oldest, oldest_cost, ncursors, last_weighted, cn, cf =
    struct.unpack('>Bi7i7i7i7i7i7i7i7i7i7i7B', h)
  local cs, p, chunk = h, cf + 8 * cn, HEAD_CACHE
  local cutoff = now - window
  if ncursors ~= 0 or horizon ~= window or (at or now) < newest or newest <= cutoff or closed <= 0 or closed > count
    or gone < 0 or total < 0 or cn > HEAD_CACHE or #h - p + 1 ~= 8 * (count - closed) then
    return nil
  end
  local changed = false
  if oldest <= cutoff then
    -- The oldest leaves (the cache's first, when it holds any), then the next ones as far as
    -- they left: from the cache, then from the elements, a chunk at a time (a cache's worth
    -- first, which the chunk fills again).
    changed = true
    total, count, closed, gone = total - oldest_cost, count - 1, closed - 1, gone + 1
    if cn > 0 then
      cf, cn = cf + 8, cn - 1
    end
    local left = oldest -- the newest entry known to have left
    while closed > 0 do
      if cn == 0 and chunk > HEAD_CACHE and last_weighted <= cutoff then
        -- More have left since the key's last write than a cache refill held, and every entry
        -- after cutoff costs 1 (its time is after last_weighted): the first that stays is found
        -- by its time, galloping then bisecting over the elements, so that a call after an idle
        -- stretch, a read-only one included, reads O(log n) entries, not the n that left; and
        -- the events that stay are counted by number.
        local j, t = busy_seek(key, gone, closed, cutoff, left, newest)
        count, closed, gone = count - j, closed - j, gone + j
        if closed > 0 then
          oldest, oldest_cost, total = t, 1, count
        else
          total = 0
          for q = p, #h, 8 do
            total = total + string.byte(h, q + 7)
          end
        end
        cn = 0
        break
      end
      if cn == 0 then
        local last = chunk
        if last > closed then
          last = closed
        end
        local es = redis.call('LRANGE', key, gone + 1, gone + last)
        if #es < last then
          busy_element(nil) -- refused: the header counts more than the list holds
        end
        local parts = {}
        for i = 1, last do
          local t, cost = busy_element(es[i])
          if cost >= 254 then
            return nil -- more than the open chunk's 8 bytes: the general path
          end
          parts[i] = struct.pack('>i7B', t, cost)
        end
        cs, cf, cn, chunk = table.concat(parts), 1, last, chunk * 4
      end
      local t, cost = struct.unpack('>i7B', cs, cf)
      if t > cutoff then
        oldest, oldest_cost = t, cost
        break
      end
      left = t
      total, count, closed, gone, cf, cn = total - cost, count - 1, closed - 1, gone + 1, cf + 8, cn - 1
    end
    if closed == 0 then
      cn = 0
    elseif cn > HEAD_CACHE then
      cn = HEAD_CACHE
    end
  end
  -- first: the oldest live entry with events, the first to give quota back.
  local first = nil
  if closed == 0 then
    local q = p
    while q <= #h do
      local t, cost = struct.unpack('>i7B', h, q)
      if t <= cutoff then
        p, total, count = q + 8, total - cost, count - 1
      elseif cost > 0 then
        first = t
        break
      end
      q = q + 8
    end
  elseif oldest_cost > 0 then
    first = oldest
  elseif total > 0 then
    return nil -- a refunded entry behind the header: the general path finds the first
  end
  return kind, total, count, newest, seq, gone, closed, oldest, oldest_cost, last_weighted, p, changed, first, cs, cf, cn
end

-- busy_cover is the time of the entry at which the live entries' cost, oldest first, reaches
-- need (of total): the wait of a denial (lib_cover.lua's covering, here read exactly): the
-- oldest entry, when it holds enough; on a unit log, the need-th entry, read alone (from the
-- head cache when it holds it); else from the head cache, walked from the oldest, or the
-- open chunk, walked from the newest back (the whole log when it is all there). nil when it
-- lies deeper in a log whose entries' costs are unknown (the general path walks).
local function busy_cover(key, h, p, gone, closed, oldest, oldest_cost, last_weighted, cs, cf, cn, total, need)
  if closed > 0 and oldest_cost >= need then
    return oldest
  end
  local first = oldest
  if closed == 0 then
    first = struct.unpack('>i7', h, p)
  end
  local j = need - 1
  if last_weighted < first then
    if j >= closed then
      return (struct.unpack('>i7', h, p + 8 * (j - closed)))
    elseif j < cn then
      return (struct.unpack('>i7', cs, cf + 8 * j))
    end
    return (busy_element(redis.call('LINDEX', key, gone + 1 + j)))
  end
  local sum = 0
  for i = 0, cn - 1 do
    local t, cost = struct.unpack('>i7B', cs, cf + 8 * i)
    sum = sum + cost
    if sum >= need then
      return t
    end
  end
  if closed == 0 or need + need > total then
    local after = 0
    for q = #h - 7, p, -8 do
      local t, cost = struct.unpack('>i7B', h, q)
      after = after + cost
      if after > total - need then
        return t
      end
    end
    if closed == 0 then
      error({err = 'BADLAYOUT the key holds a list whose header counts more events than its entries hold, not a strictrate log'})
    end
  end
  return nil
end

-- decide_busy is decide_small (lib_small.lua) for a busy key: same arguments, same results,
-- nil when the busy path does not take the request. With res, the limit's resolution (lib_log.lua,
-- Slots), it records at the end of now's slot, at: when the newest entry is that slot's (in the
-- open chunk, with events), it takes the cost in place, as merge_small does (lib_slot.lua);
-- after it, a new entry.
local function decide_busy(key, h, now, n, window, max, server_clock, res)
  local at = now
  if res then
    at = now - now % res
    if at < now then
      at = at + res
    end
  end
  local kind, total, count, newest, seq, gone, closed, oldest, oldest_cost, last_weighted, p, changed, first, cs, cf, cn = busy_read(key, h, now, window, at)
  if kind == nil then
    return nil
  end
  local merge = false
  local denied, t = total + n > max, nil
  if denied then
    t = busy_cover(key, h, p, gone, closed, oldest, oldest_cost, last_weighted, cs, cf, cn, total, total + n - max)
    if t == nil then
      return nil
    end
    if not changed then
      return math.max(max - total, 0), t + window - now, first + window - now, newest + window - now, 1, 1
    end
  else
    if n >= 254 then
      return nil -- an entry the open chunk would hold in more than 8 bytes
    end
    if res and at == newest then
      -- The slot's entry: the open chunk's last, of cost 1 to 253 - n (else the general path).
      local cost = #h >= p + 7 and string.byte(h, #h) or 0
      if cost == 0 or cost + n >= 254 then
        return nil
      end
      merge, n = true, cost + n
    elseif at == newest then
      -- The new entry's microsecond is at's (a slot's end, for a limit with a resolution),
      -- not now's: it follows the entries of that time, if any.
      seq = seq + 1
    else
      seq = 1
    end
    if first == nil then
      first = at
    end
    if n ~= 1 and at > last_weighted then
      last_weighted = at
    end
    -- The expiry first (a server that refuses it refuses before anything is recorded;
    -- lib_small.lua sets it the same way), then the entries that left go, a full open chunk
    -- moves behind the header, and the header takes the new entry.
    local ms = at - now + window + 999
    if server_clock then
      ms = now + ms
      redis.call('PEXPIREAT', key, (ms - ms % 1000) / 1000)
    else
      redis.call('PEXPIRE', key, (ms - ms % 1000) / 1000 + RELATIVE_EXPIRY_SLACK_MS)
    end
  end
  -- The gone entries go (as lib_trim.lua's trim_closed drops them: the last one stays as the
  -- header's place) once a head cache's worth wait, or every closed entry left.
  if gone >= HEAD_CACHE or gone > 0 and closed == 0 then
    redis.call('LTRIM', key, gone, -1)
    gone = 0
  end
  -- What follows the header's fields: the head cache, then the open chunk, taken from h in
  -- one piece while the cache is h's own and runs on into the open chunk.
  local tail
  if cn == 0 then
    tail = string.sub(h, p)
  elseif cs == h then
    tail = string.sub(h, cf)
  else
    tail = string.sub(cs, cf, cf + 8 * cn - 1) .. string.sub(h, p)
  end
  local entry = ''
  if merge then
    -- The slot's entry, the header's last 8 bytes, takes the new cost; the count stays.
    total, tail = total + n - string.byte(h, #h), string.sub(tail, 1, #tail - 8)
    entry = struct.pack('>i7B', at, n)
  elseif not denied then
    if #h - p + 1 >= 8 * BUSY_OPEN_MAX then
      -- The open chunk moves behind the header, each entry an element: a cost-1 entry its 7
      -- bytes of time (lib_entries.lua).
      local es = {}
      for q = p, #h, 8 do
        if string.byte(h, q + 7) == 1 then
          es[#es + 1] = string.sub(h, q, q + 6)
        else
          es[#es + 1] = string.sub(h, q, q + 7)
        end
      end
      redis.call('RPUSH', key, unpack(es))
      if closed == 0 then
        -- The log's oldest entries are these now, and the cache takes the first of them.
        oldest, oldest_cost = struct.unpack('>i7B', h, p)
        cn = HEAD_CACHE
        tail = string.sub(h, p, p + 8 * cn - 1)
      else
        tail = string.sub(tail, 1, 8 * cn)
      end
      closed = closed + #es
    end
    total, count, newest, entry = total + n, count + 1, at, struct.pack('>i7B', at, n)
  end
  -- The header: full ('K'), or small ('V', claiming no expiry) when nothing is left behind it.
  local fields
  if closed == 0 and gone == 0 then
    fields = struct.pack('>Bi7i7i7i7i7i7', KIND_V, total, count, newest, seq, window, 0)
  else
    fields = struct.pack('>Bi7i7i7i7i7i7i7i7i7i7i7B', KIND_K, total, count, newest, seq, window, gone, closed, oldest,
      oldest_cost, 0, last_weighted, cn)
  end
  redis.call('LSET', key, 0, fields .. tail .. entry)
  if denied then
    return math.max(max - total, 0), t + window - now, first + window - now, newest + window - now, 1, 1
  end
  -- The quota comes back when the first entry with events leaves, within a window at the
  -- latest (a slot's entry lies in the future).
  local quota_after = first + window - now
  if quota_after > window then
    quota_after = window
  end
  return max - total, 0, quota_after, newest + window - now, 1, seq
end
