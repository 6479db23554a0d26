-- lib_header.lua: a part of the general path, included in general()'s body (lib_log.lua),
-- where g is the table of its functions: a key's header (lib_log.lua documents its layout)
-- read into a log, the table every other part works on, and written back.
--
-- A log holds the header's fields by their names (total, count, newest, seq, horizon, gone,
-- closed, oldest, oldest_cost, tail_refunded, last_weighted), its cursors (lib_cursor.lua) and calendar
-- counters (lib_counters.lua) as lists of tables, and open, the open chunk as a string; key;
-- exists, whether the key exists; dirty, whether the header must be written. The parts note
-- more on it as a call goes (the open chunk decoded: lib_entries.lua; what the call did to
-- the key's expiry: lib_general.lua, lib_decide.lua).

-- read_log makes the log from key's header h (read_header's reply), and refuses a key that
-- holds anything else (g.refuse_layout): another type, or a list whose first element is not a
-- header beyond doubt. A header's kind byte alone is no proof (another program's list may
-- open with "Task ..." or "Version ..."): its fields must be in the ranges a log's can take,
-- its cursors, head cache and open chunk must fill it exactly, the open chunk must decode to
-- as many entries as the header counts beyond the closed ones, and the list must hold exactly
-- the elements the header counts behind it (LLEN). So every walk over the log is bounded by
-- what the key holds, and a list another program wrote is never read as a log (lib_log.lua).
function g.read_log(key, h)
  if type(h) == 'table' then
    g.refuse_layout(key, h)
  end
  if not h then
    return {key = key, exists = false, dirty = false, total = 0, count = 0, newest = NO_TIME_BEFORE,
      seq = 0, horizon = 0, gone = 0, closed = 0, oldest = 0, oldest_cost = 0, cursors = {}, open = '',
      counters = {}, last_weighted = NO_TIME_BEFORE}
  end
  local whole = h
  -- A header opens with its kind: the layout's version and the header's shape (lib_log.lua).
  local kind = string.byte(h, 1)
  local counters = {}
  if kind == KIND_C and #h >= 2 then
    -- The calendar counters, then a small or full header.
    local k, pos = struct.unpack('>B', h, 2)
    if k < 1 or k > MAX_COUNTERS or #h < pos + 21 * k then
      g.refuse_layout(key, whole)
    end
    for i = 1, k do
      local c = {}
      c.start, c.stop, c.events, pos = struct.unpack('>i7i7i7', h, pos)
      if not (g.plausible_time(c.start) and g.plausible_time(c.stop) and c.start < c.stop and c.events >= 0
        and c.events <= MAX_COUNT) then
        g.refuse_layout(key, whole)
      end
      counters[i] = c
    end
    h = string.sub(h, pos)
    kind = string.byte(h, 1)
  end
  local small, full = kind == KIND_V or kind == KIND_U, kind == KIND_K or kind == KIND_L
  if not (small and #h >= 43 or full and #h >= 79) then
    g.refuse_layout(key, whole)
  end
  local total, count, newest, seq, horizon, pos = struct.unpack('>i7i7i7i7i7', h, 2)
  local gone, closed, oldest, oldest_cost, ncursors, cached = 0, 0, 0, 0, 0, 0
  -- last_weighted: no entry at or before it is known to cost 1 (lib_log.lua); a small header's
  -- is read from its entries, below.
  local last_weighted = newest
  if small then
    -- expires is not kept: the general path sets the expiry it needs, and claims none.
    pos = pos + 7
  else
    gone, closed, oldest, oldest_cost, ncursors, last_weighted, cached, pos = struct.unpack('>i7i7i7i7i7i7B', h, pos)
  end
  if not (total >= 0 and total <= MAX_COUNT and count >= 0 and count <= MAX_COUNT and seq >= 0 and seq <= MAX_COUNT
    and (newest == NO_TIME_BEFORE or g.plausible_time(newest)) and horizon >= 0 and horizon <= MAX_WINDOW
    and gone >= 0 and gone <= MAX_COUNT and closed >= 0 and closed <= count
    and (closed == 0 or g.plausible_time(oldest) and oldest_cost >= 0 and oldest_cost <= MAX_COUNT)
    and ncursors >= 0 and ncursors <= MAX_STORED_CURSORS and cached <= HEAD_CACHE
    and (last_weighted == NO_TIME_BEFORE or g.plausible_time(last_weighted))
    and #h >= pos - 1 + 35 * ncursors + 8 * cached) then
    g.refuse_layout(key, whole)
  end
  local log = {key = key, exists = true, dirty = false, total = total, count = count,
    newest = newest, seq = seq, horizon = horizon, gone = gone, closed = closed, oldest = oldest,
    oldest_cost = oldest_cost, cursors = {}, open = nil,
    tail_refunded = kind == KIND_U or kind == KIND_L, counters = counters,
    last_weighted = last_weighted}
  for i = 1, ncursors do
    local c = {}
    c.window, c.idx, c.partial, c.before, c.after, pos = struct.unpack('>i7i7i7i7i7', h, pos)
    if not (c.window > 0 and c.window <= MAX_WINDOW and c.idx >= 0 and c.idx <= count and c.partial >= 0
      and c.partial <= total) then
      g.refuse_layout(key, whole)
    end
    log.cursors[i] = c
  end
  -- The head cache copies the oldest closed entries for the busy path alone
  -- (lib_busy.lua): the general path reads the elements, and writes the cache empty.
  log.open = string.sub(h, pos + 8 * cached)
  -- The open chunk, decoded once (lib_entries.lua's open_entries keeps it): exactly the entries
  -- the header counts beyond the closed ones, to its last byte, none costing more than the
  -- log holds.
  local ts, cs, ps, ss, s, p, held = {}, {}, {}, {}, log.open, 1, 0
  while p <= #s do
    local b = string.byte(s, p + 7)
    if b == nil or b == 254 and p + 9 > #s or b == 255 and p + 11 > #s or #ts >= count - closed then
      g.refuse_layout(key, whole)
    end
    local k = #ts + 1
    ps[k] = p
    ts[k], cs[k], p, ss[k] = read_entry(s, p)
    held = held + cs[k]
    if not g.plausible_time(ts[k]) or held > total then
      g.refuse_layout(key, whole)
    end
  end
  ps[#ps + 1] = p
  if #ts ~= count - closed or closed == 0 and held ~= total then
    g.refuse_layout(key, whole)
  end
  log.open_ts, log.open_cs, log.open_ps, log.open_ss = ts, cs, ps, ss
  if closed == 0 and small then
    -- A header that holds every live entry tells their costs: the newest that is not 1.
    local w = NO_TIME_BEFORE
    for i = 1, #ts do
      if cs[i] ~= 1 then
        w = ts[i]
      end
    end
    log.last_weighted = w
  end
  -- The elements behind the header are the gone and closed entries, no more and no fewer.
  if redis.call('LLEN', key) ~= 1 + gone + closed then
    g.refuse_layout(key, whole)
  end
  return log
end

-- plausible_time reports whether t can be an entry's time: within the years 1827 to 2112
-- (lib_log.lua), which no 7 bytes of text (each 0x20 or above) decode to.
function g.plausible_time(t)
  return t > -MAX_TIME and t < MAX_TIME
end

-- refuse_layout raises BADLAYOUT for key, whose header read (h) was not a log's: the server's
-- error (the key holds another type) or a string of no kind this release reads. The message
-- says what was found, for the operator.
function g.refuse_layout(key, h)
  local found
  if type(h) == 'table' then
    found = 'a ' .. redis.call('TYPE', key).ok
  else
    found = string.format('a list whose first element (%d bytes, first byte 0x%02x) is no log '
      .. 'header of layout %d, or does not agree with what the list holds', #h, string.byte(h, 1) or 0, LAYOUT)
  end
  error({err = 'BADLAYOUT the key holds ' .. found .. ', not a strictrate log'})
end

-- refuse_elements raises BADLAYOUT for key, whose elements behind a header that read as a
-- log's do not agree with it (why says how): the list is not a log, and nothing is written.
function g.refuse_elements(key, why)
  error({err = 'BADLAYOUT the key holds a list whose elements do not agree with its header (' .. why
    .. '), not a strictrate log'})
end

-- save writes the header when it changed: small ('V', or 'U' when the last entry is a
-- refunded run; claiming no expiry) when the log has no element but the header and keeps no
-- cursor, else full ('K' or 'L', its head cache empty); behind the calendar counters when it
-- keeps some. It notes created on a log whose key it made.
function g.save(log)
  if not log.dirty then
    return
  end
  local cursors, parts = log.cursors, {}
  for k = 1, #cursors do
    local c = cursors[k]
    -- When more windows than a policy may hold (MAX_CURSORS) have been counted on this key, keep the
    -- cursors this call used.
    if #cursors <= MAX_CURSORS or c.used then
      parts[#parts + 1] = struct.pack('>i7i7i7i7i7', c.window, c.idx, c.partial, c.before, c.after)
    end
  end
  local header = g.counters_prefix(log)
  if log.gone == 0 and log.closed == 0 and #parts == 0 then
    header = header .. (log.tail_refunded and 'U' or 'V') .. struct.pack('>i7i7i7i7i7i7', log.total, log.count,
      log.newest, log.seq, log.horizon, 0) .. log.open
  else
    header = header .. (log.tail_refunded and 'L' or 'K') .. struct.pack('>i7i7i7i7i7i7i7i7i7i7i7B', log.total, log.count,
      log.newest, log.seq, log.horizon, log.gone, log.closed, log.oldest, log.oldest_cost, #parts, log.last_weighted, 0)
      .. table.concat(parts) .. log.open
  end
  if log.exists then
    redis.call('LSET', log.key, 0, header)
  else
    redis.call('RPUSH', log.key, header)
    log.created = true
  end
  log.exists = true
end

-- counters_prefix is the prefix of log's header: its calendar counters
-- (lib_log.lua), '' when it keeps none. When more than MAX_COUNTERS are live, it keeps the ones
-- this call used, then the latest to end.
function g.counters_prefix(log)
  local counters = log.counters
  if #counters == 0 then
    return ''
  end
  if #counters > MAX_COUNTERS then
    table.sort(counters, function(a, b)
      if (a.used or false) ~= (b.used or false) then
        return a.used or false
      end
      return a.stop > b.stop
    end)
    for i = #counters, MAX_COUNTERS + 1, -1 do
      counters[i] = nil
    end
  end
  local parts = {'C', string.char(#counters)}
  for i = 1, #counters do
    local c = counters[i]
    parts[#parts + 1] = struct.pack('>i7i7i7', c.start, c.stop, c.events)
  end
  return table.concat(parts)
end
