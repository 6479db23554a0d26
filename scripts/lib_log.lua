-- lib_log.lua: a part included by the scripts (not a script of its own): a key's log.
--
-- A key's log is one admitted request per entry, in time order (oldest first), each carrying
-- its time and its cost in events. It is stored as one Valkey list:
--
--   element 0        the header: the log's totals, its cursors, then the newest entries (the
--                    open chunk, up to 32 of them) as one string
--   elements 1..     the older entries, one element each: first "gone" entries that have left
--                    every window and wait to be dropped, then "closed" live ones; a closed
--                    cost-1 entry is its 7 bytes of time alone (9 bytes of listpack)
--
-- Most keys hold few live entries, so their whole log is the header: a decision reads one
-- element, rewrites it, and sets the expiry. When the open chunk is full, its entries move
-- behind the header in one RPUSH; entries that left the window there are dropped a few at a
-- time with one LTRIM. (A log that fits in its header could be a string key, written with
-- its expiry by one SET PX instead of LSET and PEXPIRE: measured, it cost the server as much.)
--
-- An entry is 7 bytes of time (microseconds since the Unix epoch, big-endian two's
-- complement), then its cost: one byte below 254; 254 and 2 bytes; 255 and 4 bytes (all
-- big-endian). A cost-1 entry is 8 bytes in the open chunk, 7 as an element. An entry's
-- identity is its time and its position among the entries of that microsecond (seq, from 1).
-- The first byte of a time between the years 1827 and 2112 is 0x00-0x0F or 0xF0-0xFF, so no
-- entry or header reads as a decimal integer: the list keeps them as strings.
--
-- Slots: a limit with a resolution records a request at the end of its slot (its time rounded
-- up to a multiple of the resolution), and adds its cost to the entry of that time that
-- carries events, when one is among the newest few (g.merge_slot): the entry is then shared by the slot's requests, and a
-- settle of one of them (settle.lua, shared) takes its cost off the slot's entry.
--
-- Refunds: a settle lowers the cost in place. An entry refunded in full joins the refunded
-- entries of its microsecond beside it into one refunded run, which stands for all their seqs
-- (span), written in the encodings make_entry never uses: 254 then a span below 254, 255 then
-- a span below 65536 (a span of one is a plain cost-0 entry). A run leaves the log once it is
-- the last entry of its microsecond (no later seq counts on it) and older than the newest (no
-- append can take its seqs); one left at the end goes with the next append of a later
-- microsecond. So refunded entries never outnumber live ones plus one, and no identity of
-- another entry moves.
--
-- The header opens with its kind, one byte, which says the layout's version and the header's
-- shape. Version 2 (this release writes it, unless told to write version 3): 'T' small (five
-- fields, then the open chunk) or 'G' full (ten fields, then cursors, then the open chunk);
-- 'U' and 'H' are the same when the last entry is a refunded run. Version 3 adds 'V': a small
-- header as 'T' with a sixth field, expires (see below); only decide_small (lib_small.lua)
-- writes it, and only when the script is composed with WRITE_LAYOUT 3 (the engine's
-- WithWriteLayout); every other write of a 'V' log writes version 2. Version 1 (earlier
-- releases): 'S' and 'F', the same without the horizon. Versions 1 to 3 are read; a write
-- replaces version 1 by version 2. A later version takes other kinds. A key whose value is
-- anything else (another type, a list whose first element is no header of these versions: a
-- later release's, or another program's) is refused with an error reply BADLAYOUT that says
-- what was found; it is never read as a log, never converted, and nothing is written to it.
--
-- Version 4 adds 'C', a prefix for calendar counters (the engine's Calendar limits): 'C', a
-- byte k (1 to MAX_COUNTERS), then k counters of three fields (start, end: the period, in
-- microseconds, start <= t < end; events: the events admitted on the key in that period since
-- the counter was made), then a header of version 2 as above. Every admission on the key adds
-- its cost to every counter whose period holds its time, so a counter counts the key's events
-- whatever limit admitted them, from its first use on; a refund takes its give-back from the
-- counters whose period holds the request's decision time. A counter whose period ended is
-- dropped when a later period's counter is made; a request of a period that ended on the key
-- (a later counter exists: a caller's clock behind) is denied until that period's end. A log with counters is written as version 4 whatever the
-- engine's WithWriteLayout: only a calendar limit makes one, and a release that reads no 'C'
-- refuses it (BADLAYOUT) rather than lose its counts.
--
-- expires ('V' only) is a time, in the server's milliseconds, at or before which the key's
-- expiry lies: whoever writes a 'V' header has set the key to expire then or later, and a
-- write that sets the expiry without knowing it writes version 2. So a decision whose entry
-- needs the key until no later than expires sets no expiry at all; one that needs it longer
-- sets it with slack (lib_small.lua), and most decisions of a busy key make three server
-- calls, not four.
--
-- The fields, 7 bytes big-endian each: total (the live entries' cost), count (live entries),
-- newest (the newest entry's time), seq (its position in its microsecond), horizon (the
-- longest window ever counted on the key: the log keeps what it counts, and the key's expiry
-- follows it, so no limit on the key trims what another one counts); and, full only: gone,
-- closed (see above), oldest and oldest_cost (the oldest closed entry's time and cost, when
-- closed > 0), cursors (how many follow). A cursor, five fields, is kept per
-- shorter window counted on this key: window, idx (the live entries at or before the window's
-- start are entries [0, idx)), partial (their cost), before and after (the times of entries
-- idx-1 and idx; -2^54 and 2^54 where there is none). A cursor moves only as far as the clock
-- did, so counting a shorter window costs amortized O(1), like trimming the horizon.
--
-- Counting: the events in a window at now are the cost of the entries with a time after
-- now - window, later than now included (callers' clocks may disagree: that can deny early,
-- never admit too many). Live entries are numbered from 0: the closed ones, then the open
-- chunk's.
--
-- Speed: EVALSHA makes every function of a script anew on each call, and a function costs
-- more to make the more of the script's locals it captures; every redis.call, every element
-- of its reply and every table cost more than most Lua. So the common decision (one limit, a
-- small log) is decide_small (lib_small.lua), which works on the header string and locals alone;
-- everything else goes through general(), whose functions are made only by the calls that need them.
-- The layout's constants are named by the --const lines below: the composer (scripts.go)
-- writes each one's value in its place in the code, so a constant costs a call nothing (as a
-- local it would be an upvalue of every function that uses it: measured on callgrind, 6 %
-- more instructions per common decision).
--
-- The header kinds (see above), as bytes.
--const KIND_T 84
--const KIND_U 85
--const KIND_G 71
--const KIND_H 72
--const KIND_S 83
--const KIND_F 70
--const KIND_V 86
--const KIND_C 67
-- MAX_COUNTERS is the most calendar counters a log keeps: the periods live at once on a key
-- (a policy's day, week, month and year, say), as many as a policy's limits.
--const MAX_COUNTERS 16
-- OPEN_CHUNK_MAX is the most entries the header's open chunk holds.
--const OPEN_CHUNK_MAX 32
-- COVER_WALK is the most entries a decision reads from each end of a window to find when a
-- denied request would be admitted (g.covering).
--const COVER_WALK 32
-- MAX_CURSORS is the most windows a policy counts at once: the engine's MaxPolicyLimits, which
-- a test ties to this value. A log keeps at least that many cursors.
--const MAX_CURSORS 16
-- NO_TIME_BEFORE and NO_TIME_AFTER stand for "no entry" on either side of a cursor: below and
-- above every time a log holds (the years 1827 to 2112 are within +-2^52 microseconds).
--const NO_TIME_BEFORE (-2 ^ 54)
--const NO_TIME_AFTER (2 ^ 54)

-- make_entry encodes an entry.
local function make_entry(t, cost)
  if cost < 254 then
    return struct.pack('>i7B', t, cost)
  elseif cost < 65536 then
    return struct.pack('>i7BI2', t, 254, cost)
  end
  return struct.pack('>i7BI4', t, 255, cost)
end

-- read_entry decodes the entry at byte pos of s: its time, its cost, the position after it,
-- and, for a refunded run (see the header comment), how many seqs it stands for (nil: one).
local function read_entry(s, pos)
  local t = struct.unpack('>i7', s, pos)
  local b = string.byte(s, pos + 7)
  if b < 254 then
    return t, b, pos + 8
  end
  -- 254: the value in 2 bytes; 255: in 4. Below the least cost make_entry writes that way, the
  -- value is a refunded run's span.
  local format, size, least = '>I2', 2, 254
  if b == 255 then
    format, size, least = '>I4', 4, 65536
  end
  local v = struct.unpack(format, s, pos + 8)
  if v < least then
    return t, 0, pos + 8 + size, v
  end
  return t, v, pos + 8 + size
end

-- make_run encodes a refunded run: span refunded entries of one microsecond (1 to 65535), as
-- one entry of cost 0. One is a plain entry of cost 0; more use the cost encodings that
-- make_entry never writes (254 then a value below 254; 255 then a value below 65536).
local function make_run(t, span)
  if span == 1 then
    return make_entry(t, 0)
  elseif span < 254 then
    return struct.pack('>i7BI2', t, 254, span)
  end
  return struct.pack('>i7BI4', t, 255, span)
end

-- keep_log_until makes key last at least until until_us, its newest entry's time plus the key's
-- horizon: on the server's clock (server_clock) by PEXPIREAT at that time in milliseconds,
-- rounded up, so that the key goes within a millisecond after its last entry leaves every
-- window; on a caller's clock by PEXPIRE, relative to now, as the caller's clock may be far
-- from the server's, with RELATIVE_EXPIRY_SLACK_MS more: the server counts a relative expiry
-- from its time at the call's start, in whole milliseconds, which may lie up to one
-- millisecond (and one more across a boundary) before now.
--const RELATIVE_EXPIRY_SLACK_MS 2
local function keep_log_until(key, now, until_us, server_clock)
  if server_clock then
    redis.call('PEXPIREAT', key, math.ceil(until_us / 1000))
  else
    redis.call('PEXPIRE', key, math.ceil((until_us - now) / 1000) + RELATIVE_EXPIRY_SLACK_MS)
  end
end

-- read_header reads key's header: the string, false when the key does not exist, or the
-- server's error as a table (the key holds something else).
local function read_header(key)
  return redis.pcall('LINDEX', key, 0)
end

-- write_small writes a small header: its kind ('T', or 'U' when the last entry is a refunded
-- run; nil: 'T'), total, count, newest, seq, horizon, then the open chunk, given in two parts.
local function write_small(key, exists, total, count, newest, seq, horizon, open, more, kind)
  local header = (kind or 'T') .. struct.pack('>i7i7i7i7i7', total, count, newest, seq, horizon) .. open .. more
  if exists then
    redis.call('LSET', key, 0, header)
  else
    redis.call('RPUSH', key, header)
  end
end

-- general returns the functions of the general path: the log as a table, for policies,
-- peeks, settles, big logs and callers' clocks out of step. They are made on the first call
-- that needs them (see Speed, above).
local general_functions
local function general()
  if general_functions ~= nil then
    return general_functions
  end
  local g = {}
  general_functions = g

  -- refuse_layout raises BADLAYOUT for key, whose header read (h) was not a log's: the server's
  -- error (the key holds another type) or a string of no kind this release reads. The message
  -- says what was found, for the operator.
  function g.refuse_layout(key, h)
    local found
    if type(h) == 'table' then
      found = 'a ' .. redis.call('TYPE', key).ok
    else
      found = string.format('a list whose first element (%d bytes, first byte 0x%02x) is no log '
        .. 'header of layout 1, 2 or 3', #h, string.byte(h, 1) or 0)
    end
    error({err = 'BADLAYOUT the key holds ' .. found .. ', not a strictrate log'})
  end

  -- make_element encodes an entry as an element of its own (a closed entry): as in the open
  -- chunk, but a cost-1 entry is its 7 bytes of time alone, since the element's length tells.
  -- A refunded run of more than one seq (span) is make_run's.
  function g.make_element(t, cost, span)
    if cost == 1 then
      return struct.pack('>i7', t)
    elseif cost == 0 and span ~= nil then
      return make_run(t, span)
    end
    return make_entry(t, cost)
  end

  -- read_element decodes a closed entry: its time, cost and span (nil: one seq).
  function g.read_element(e)
    if #e == 7 then
      return (struct.unpack('>i7', e)), 1
    end
    local t, cost, _, span = read_entry(e, 1)
    return t, cost, span
  end

  -- read_log makes the log from key's header h (read_header's reply), and refuses a key that
  -- holds anything else (g.refuse_layout).
  function g.read_log(key, h)
    if type(h) == 'table' then
      g.refuse_layout(key, h)
    end
    if not h then
      return {key = key, exists = false, dirty = false, total = 0, count = 0, newest = NO_TIME_BEFORE,
        seq = 0, horizon = 0, gone = 0, closed = 0, oldest = 0, oldest_cost = 0, cursors = {}, open = '',
        counters = {}}
    end
    -- A header opens with its kind: the layout's version and the header's shape (see above).
    local kind = string.byte(h, 1)
    local counters = {}
    if kind == KIND_C and #h >= 2 then
      -- Version 4: the calendar counters, then a header of version 2.
      local k, pos = struct.unpack('>B', h, 2)
      if k < 1 or #h < pos + 21 * k then
        g.refuse_layout(key, h)
      end
      for i = 1, k do
        local c = {}
        c.start, c.stop, c.events, pos = struct.unpack('>i7i7i7', h, pos)
        counters[i] = c
      end
      h = string.sub(h, pos)
      kind = string.byte(h, 1)
      if kind ~= KIND_T and kind ~= KIND_U and kind ~= KIND_G and kind ~= KIND_H then
        g.refuse_layout(key, h)
      end
    end
    local small, full = kind == KIND_T or kind == KIND_U, kind == KIND_G or kind == KIND_H
    if not (small and #h >= 36 or full and #h >= 71 or kind == KIND_V and #h >= 43 or kind == KIND_S and #h >= 29 or kind == KIND_F and #h >= 64) then
      g.refuse_layout(key, h)
    end
    local total, count, newest, seq, pos = struct.unpack('>i7i7i7i7', h, 2)
    local horizon, gone, closed, oldest, oldest_cost, ncursors = 0, 0, 0, 0, 0, 0
    if small or full then
      horizon, pos = struct.unpack('>i7', h, pos)
    elseif kind == KIND_V then
      -- expires is not kept: this log is written back as version 2, which claims none.
      horizon, pos = struct.unpack('>i7', h, pos)
      pos = pos + 7
    end
    if full or kind == KIND_F then
      gone, closed, oldest, oldest_cost, ncursors, pos = struct.unpack('>i7i7i7i7i7', h, pos)
    end
    local log = {key = key, exists = true, dirty = false, total = total, count = count,
      newest = newest, seq = seq, horizon = horizon, gone = gone, closed = closed, oldest = oldest,
      oldest_cost = oldest_cost, cursors = {}, open = nil, tail_refunded = kind == KIND_U or kind == KIND_H,
      counters = counters}
    for i = 1, ncursors do
      local c = {}
      c.window, c.idx, c.partial, c.before, c.after, pos = struct.unpack('>i7i7i7i7i7', h, pos)
      log.cursors[i] = c
    end
    log.open = string.sub(h, pos)
    return log
  end

  -- save writes the header when it changed.
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
    local prefix = g.counters_prefix(log)
    if log.gone == 0 and log.closed == 0 and #parts == 0 and prefix == '' then
      write_small(log.key, log.exists, log.total, log.count, log.newest, log.seq, log.horizon, log.open, '',
        log.tail_refunded and 'U' or 'T')
    else
      local header
      if log.gone == 0 and log.closed == 0 and #parts == 0 then
        header = prefix .. (log.tail_refunded and 'U' or 'T') .. struct.pack('>i7i7i7i7i7', log.total, log.count,
          log.newest, log.seq, log.horizon) .. log.open
      else
        header = prefix .. (log.tail_refunded and 'H' or 'G') .. struct.pack('>i7i7i7i7i7i7i7i7i7i7', log.total, log.count, log.newest,
          log.seq, log.horizon, log.gone, log.closed, log.oldest, log.oldest_cost, #parts) .. table.concat(parts) .. log.open
      end
      if log.exists then
        redis.call('LSET', log.key, 0, header)
      else
        redis.call('RPUSH', log.key, header)
        log.created = true
      end
    end
    log.exists = true
  end

  -- counters_prefix is the version 4 prefix of log's header: its calendar counters (see
  -- above), '' when it keeps none. When more than MAX_COUNTERS are live, it keeps the ones
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

  -- counter returns log's counter of the period [start, stop), or nil.
  function g.counter(log, start, stop)
    local counters = log.counters
    for i = 1, #counters do
      local c = counters[i]
      if c.start == start and c.stop == stop then
        return c
      end
    end
    return nil
  end

  -- drop_before forgets the counters whose period ended at or before start, a new counter's:
  -- a period ends on a key when a later one starts counting on it.
  function g.drop_before(log, start)
    local counters, kept = log.counters, {}
    for i = 1, #counters do
      if counters[i].stop > start then
        kept[#kept + 1] = counters[i]
      end
    end
    if #kept ~= #counters then
      log.counters, log.dirty = kept, true
    end
  end

  -- ended reports whether a period that ends at stop is over on log: a counter of a later
  -- period exists (so its own counter, if it had one, may be gone).
  function g.ended(log, stop)
    local counters = log.counters
    for i = 1, #counters do
      if counters[i].start >= stop then
        return true
      end
    end
    return false
  end

  -- count_in adds events (negative: takes them back, never below 0) to every counter whose
  -- period holds t, and returns how many it changed.
  function g.count_in(log, t, events)
    local changed, counters = 0, log.counters
    for i = 1, #counters do
      local c = counters[i]
      if c.start <= t and t < c.stop then
        local v = c.events + events
        if v < 0 then
          v = 0
        end
        if v ~= c.events then
          c.events, changed, log.dirty = v, changed + 1, true
        end
      end
    end
    return changed
  end

  -- period picks, from a calendar limit's boundaries b0 < b1 < b2 < b3 (the engine computes
  -- them around its own clock: the period before, the current one, the next), the period
  -- that holds now: its start and end. A now outside them all is a clock too far from the
  -- engine's, refused with BADCLOCK.
  function g.period(cal, now)
    for i = 2, 4 do
      if cal[i] <= now and now < cal[i + 1] then
        return cal[i], cal[i + 1]
      end
    end
    error({err = string.format('BADCLOCK the time %d is outside the calendar periods %d to %d the engine sent: '
      .. 'its clock and the server\'s differ by more than a period', now, cal[2], cal[5])})
  end

  -- reset_at is when log holds no event any more: its newest entry plus reach (its horizon),
  -- or the end of the latest period a counter holds events in; NO_TIME_BEFORE when empty.
  function g.reset_at(log, reach)
    local at = NO_TIME_BEFORE
    if log.count > 0 then
      at = log.newest + reach
    end
    local counters = log.counters
    for i = 1, #counters do
      local c = counters[i]
      if c.events > 0 and c.stop > at then
        at = c.stop
      end
    end
    return at
  end

  -- view splits a request's flat limits (decide.lua documents them) once: sliding, the
  -- (window, max) pairs, windows ascending; res, the resolution entries are recorded at (0:
  -- exact); cals, the calendar limits, each {max, b0, b1, b2, b3}; hold, how long after now
  -- the entry is recorded (a reservation; 0 for an admission).
  function g.view(limits)
    if limits.sliding == nil then
      local sliding, cals, res, hold, i = {}, {}, 0, 0, 1
      while i <= #limits do
        local v = limits[i]
        if v == -1 then
          res, i = limits[i + 1], i + 2
        elseif v == -3 then
          hold, i = limits[i + 1], i + 2
        elseif v == -2 then
          cals[#cals + 1] = {limits[i + 1], limits[i + 2], limits[i + 3], limits[i + 4], limits[i + 5]}
          i = i + 6
        else
          sliding[#sliding + 1] = v
          sliding[#sliding + 1] = limits[i + 1]
          i = i + 2
        end
      end
      limits.sliding, limits.res, limits.cals, limits.hold = sliding, res, cals, hold
    end
    return limits.sliding, limits.res, limits.cals, limits.hold
  end

  -- shift_cursors moves every cursor back by dropped entries of cost cost that left the log's
  -- front; after is the time of the new first entry.
  function g.shift_cursors(log, dropped, cost, after)
    local cursors = log.cursors
    for k = 1, #cursors do
      local c = cursors[k]
      if c.idx >= dropped then
        c.idx = c.idx - dropped
        c.partial = c.partial - cost
        if c.idx == 0 then
          c.before = NO_TIME_BEFORE
        end
      else
        -- The trim reached inside this cursor's window (a shorter limit trimmed the log).
        c.idx, c.partial, c.before, c.after = 0, 0, NO_TIME_BEFORE, after
      end
    end
  end

  -- open_entries decodes the open chunk once per call: times, costs, byte positions, and the
  -- spans of refunded runs (by entry number; absent: one seq).
  function g.open_entries(log)
    if log.open_ts == nil then
      local ts, cs, ps, ss, pos, s = {}, {}, {}, {}, 1, log.open
      while pos <= #s do
        local k = #ts + 1
        ps[k] = pos
        ts[k], cs[k], pos, ss[k] = read_entry(s, pos)
      end
      ps[#ps + 1] = pos
      log.open_ts, log.open_cs, log.open_ps, log.open_ss = ts, cs, ps, ss
    end
    return log.open_ts, log.open_cs, log.open_ps, log.open_ss
  end

  -- set_open replaces the open chunk, forgetting its decoded form.
  function g.set_open(log, s)
    log.open, log.open_ts, log.open_cs, log.open_ps = s, nil, nil, nil
  end

  -- entries returns the times, costs and spans (by position; absent: one seq) of live entries
  -- [from, to] (clamped to the last).
  function g.entries(log, from, to)
    if to >= log.count then
      to = log.count - 1
    end
    local ts, cs, ss = {}, {}, {}
    if from < log.closed then
      local last = to
      if last >= log.closed then
        last = log.closed - 1
      end
      local skip = 1 + log.gone
      local es = redis.call('LRANGE', log.key, from + skip, last + skip)
      for i = 1, #es do
        ts[i], cs[i], ss[i] = g.read_element(es[i])
      end
    end
    if to >= log.closed then
      local ots, ocs, _, oss = g.open_entries(log)
      local first = from
      if first < log.closed then
        first = log.closed
      end
      for i = first, to do
        local k = #ts + 1
        ts[k], cs[k], ss[k] = ots[i - log.closed + 1], ocs[i - log.closed + 1], oss[i - log.closed + 1]
      end
    end
    return ts, cs, ss
  end

  -- entry_at returns the time, cost and span (nil: one seq) of live entry i.
  function g.entry_at(log, i)
    local ts, cs, ss = g.entries(log, i, i)
    return ts[1], cs[1], ss[1]
  end

  -- oldest_time is the time of the oldest live entry, or 2^54 when there is none.
  function g.oldest_time(log)
    if log.count == 0 then
      return NO_TIME_AFTER
    elseif log.closed > 0 then
      return log.oldest
    end
    return (read_entry(log.open, 1))
  end

  -- trim_closed is trim's part for a log with closed entries: it drops them (and, when they
  -- all left, the open chunk's) up to cutoff, and returns how many left and their cost.
  function g.trim_closed(log, cutoff)
    local dropped, cost, chunk = 0, 0, 4
    while dropped < log.closed do
      local ts, cs = g.entries(log, dropped, math.min(dropped + chunk, log.closed) - 1)
      for i = 1, #ts do
        if ts[i] > cutoff then
          log.oldest, log.oldest_cost = ts[i], cs[i]
          chunk = 0
          break
        end
        dropped = dropped + 1
        cost = cost + cs[i]
      end
      if chunk == 0 then
        break
      end
      chunk = chunk * 4
    end
    log.gone = log.gone + dropped
    log.closed = log.closed - dropped
    if log.gone > 2 or log.closed == 0 then
      -- Drop the gone entries with the header's element: the last one stays as the header's
      -- place, which save overwrites.
      redis.call('LTRIM', log.key, log.gone, -1)
      log.gone = 0
    end
    return dropped, cost
  end

  -- move puts cursor c at bound: entries [0, c.idx) have times at or before bound, the rest
  -- after it. It reports whether c moved.
  function g.move(log, c, bound)
    local moved = false
    local chunk = 4
    while c.after <= bound do
      local ts, cs = g.entries(log, c.idx, c.idx + chunk - 1)
      for i = 1, #ts do
        local t = ts[i]
        if t > bound then
          c.after = t
          break
        end
        c.partial = c.partial + cs[i]
        c.idx = c.idx + 1
        c.before = t
      end
      if c.idx == log.count then
        c.after = NO_TIME_AFTER
      end
      chunk = chunk * 4
      moved = true
    end
    chunk = 4
    while c.before > bound do
      local first = c.idx - chunk
      if first < 0 then
        first = 0
      end
      local ts, cs = g.entries(log, first, c.idx - 1)
      for i = #ts, 1, -1 do
        local t = ts[i]
        if t <= bound then
          c.before = t
          break
        end
        c.partial = c.partial - cs[i]
        c.idx = c.idx - 1
        c.after = t
      end
      if c.idx == 0 then
        c.before = NO_TIME_BEFORE
      end
      chunk = chunk * 4
      moved = true
    end
    return moved
  end

  -- cursor returns a cursor for window at now: with keep, the log's own (made if need be, and
  -- marked used), else a copy the caller may move without writing it.
  function g.cursor(log, window, now, keep)
    local c
    for _, stored in ipairs(log.cursors) do
      if stored.window == window then
        c = stored
        break
      end
    end
    if c == nil then
      c = {window = window, idx = 0, partial = 0, before = NO_TIME_BEFORE, after = g.oldest_time(log)}
      if keep then
        log.cursors[#log.cursors + 1] = c
        log.dirty = true
      end
    elseif not keep then
      c = {window = window, idx = c.idx, partial = c.partial, before = c.before, after = c.after}
    end
    if g.move(log, c, now - window) and keep then
      log.dirty = true
    end
    c.used = true
    return c
  end

  -- covering returns when need of the held events of a window (its live entries, from entry
  -- from on) have left it: the time of the entry at which the entries' cost, oldest first,
  -- reaches need. It reads at most COVER_WALK entries from each end of the window, the end
  -- where that entry most likely lies first, so that no request buys server time with its
  -- cost, or with how far a lowered limit leaves the log over it: the entry is among the
  -- oldest when few events must leave (a request of cost 1), among the newest when most must
  -- (a cost near max). When it lies deeper in a long log, covering returns the time of the last
  -- entry read from the front: the entry lies after it, so the request is not admitted before
  -- that one leaves (a wait that never overstates, which the engine's deny cache relies on).
  function g.covering(log, from, need, held)
    if from == 0 and log.closed > 0 and log.oldest_cost >= need then
      return log.oldest
    end
    local front_end = from + COVER_WALK
    if front_end > log.count then
      front_end = log.count
    end
    local back_start = log.count - COVER_WALK
    if back_start < front_end then
      back_start = front_end
    end
    local newest_first = need + need > held
    if newest_first then
      local t = g.cover_back(log, back_start, need, held)
      if t ~= nil then
        return t
      end
    end
    local t, last = g.cover_front(log, from, front_end, need)
    if t ~= nil then
      return t
    elseif front_end == log.count then
      error('strictrate: the log holds fewer events than its header counts')
    end
    if not newest_first then
      t = g.cover_back(log, back_start, need, held)
      if t ~= nil then
        return t
      end
    end
    return last
  end

  -- cover_front is covering's walk from the oldest entry of the window (from) up to entry
  -- stop, excluded: the time of the entry at which the cost reaches need, or nil and the time
  -- of the last entry read.
  function g.cover_front(log, from, stop, need)
    local sum, i, chunk, last = 0, from, 4, nil
    while i < stop do
      local to = i + chunk - 1
      if to >= stop then
        to = stop - 1
      end
      local ts, cs = g.entries(log, i, to)
      for j = 1, #ts do
        sum = sum + cs[j]
        if sum >= need then
          return ts[j]
        end
        last = ts[j]
      end
      i = i + #ts
      chunk = chunk * 4
    end
    return nil, last
  end

  -- cover_back is covering's walk from the newest entry back to entry lowest: the entry it
  -- seeks is the first, going back, after which at most held - need events stay in the
  -- window; nil when none of these is.
  function g.cover_back(log, lowest, need, held)
    local after, hi, chunk = 0, log.count - 1, 4
    while hi >= lowest do
      local lo = hi - chunk + 1
      if lo < lowest then
        lo = lowest
      end
      local ts, cs = g.entries(log, lo, hi)
      for j = #ts, 1, -1 do
        after = after + cs[j]
        if after > held - need then
          return ts[j]
        end
      end
      hi = lo - 1
      chunk = chunk * 4
    end
    return nil
  end

  -- flush moves the open chunk's entries behind the header, as closed entries.
  function g.flush(log)
    local ts, cs, _, ss = g.open_entries(log)
    if #ts == 0 then
      return
    end
    local es = {}
    for i = 1, #ts do
      es[i] = g.make_element(ts[i], cs[i], ss[i])
    end
    redis.call('RPUSH', log.key, unpack(es))
    if log.closed == 0 then
      log.oldest, log.oldest_cost = ts[1], cs[1]
    end
    log.closed = log.closed + #ts
    g.set_open(log, '')
  end

  -- insert_before adds an entry of cost at time t behind the last entry at or before t, when
  -- a later entry exists (a caller's clock behind another's), and returns its index and seq.
  function g.insert_before(log, t, cost)
    local same, p, hi, chunk, done = 0, nil, log.count - 1, 4, false
    while hi >= 0 and not done do
      local lo = hi - chunk + 1
      if lo < 0 then
        lo = 0
      end
      local ts, _, ss = g.entries(log, lo, hi)
      for j = #ts, 1, -1 do
        if ts[j] > t then
          p = lo + j - 1
        elseif ts[j] == t then
          same = same + (ss[j] or 1)
        else
          done = true
          break
        end
      end
      hi = lo - 1
      chunk = chunk * 4
    end
    if p >= log.closed then
      local _, _, ps = g.open_entries(log)
      local at = ps[p - log.closed + 1]
      g.set_open(log, string.sub(log.open, 1, at - 1) .. make_entry(t, cost) .. string.sub(log.open, at))
    else
      -- Every element before entry p (the header, gone entries, entries at or before t)
      -- differs from it, so the first element equal to it is entry p.
      local pt, pc, ps = g.entry_at(log, p)
      redis.call('LINSERT', log.key, 'BEFORE', g.make_element(pt, pc, ps), g.make_element(t, cost))
      log.closed = log.closed + 1
      if p == 0 then
        log.oldest, log.oldest_cost = t, cost
      end
    end
    return p, same + 1
  end

  -- find returns the live index of the entry with time t and position seq among the entries
  -- of that microsecond, or nil when the log holds none.
  function g.find(log, t, seq)
    if log.count == 0 or t > log.newest or t < g.oldest_time(log) then
      return nil
    end
    -- The first entry at or after t: most lookups are of recent entries, in the open chunk.
    local lo, hi = 0, log.count - 1
    if log.count > log.closed and g.entry_at(log, log.closed) < t then
      lo = log.closed
    end
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      if g.entry_at(log, mid) < t then
        lo = mid + 1
      else
        hi = mid
      end
    end
    -- The entries of that microsecond in order, a refunded run standing for its span of seqs.
    local below = 0
    for at = lo, log.count - 1 do
      local et, _, span = g.entry_at(log, at)
      if et ~= t then
        return nil
      end
      below = below + (span or 1)
      if seq <= below then
        return at
      end
    end
    return nil
  end

  -- set_cost rewrites live entry i's cost; with span, it becomes a refunded run of span seqs
  -- (cost 0).
  function g.set_cost(log, i, cost, span)
    local t = g.entry_at(log, i)
    if i < log.closed then
      redis.call('LSET', log.key, 1 + log.gone + i, g.make_element(t, cost, span))
      if i == 0 then
        log.oldest_cost = cost
      end
    else
      local _, _, ps = g.open_entries(log)
      local k = i - log.closed + 1
      local e = make_entry(t, cost)
      if span ~= nil then
        e = make_run(t, span)
      end
      g.set_open(log, string.sub(log.open, 1, ps[k] - 1) .. e .. string.sub(log.open, ps[k + 1]))
    end
  end

  -- remove takes live entry i, which carries no events, out of the log, and keeps the cursors
  -- on the entries they stood at.
  function g.remove(log, i)
    if i < log.closed then
      -- No entry is a single byte, so 'x' marks the element for LREM alone.
      local at = 1 + log.gone + i
      redis.call('LSET', log.key, at, 'x')
      redis.call('LREM', log.key, 1, 'x')
      log.closed = log.closed - 1
    else
      local _, _, ps = g.open_entries(log)
      local k = i - log.closed + 1
      g.set_open(log, string.sub(log.open, 1, ps[k] - 1) .. string.sub(log.open, ps[k + 1]))
    end
    log.count = log.count - 1
    if i == 0 and log.closed > 0 then
      log.oldest, log.oldest_cost = g.entry_at(log, 0)
    end
    local cursors = log.cursors
    for k = 1, #cursors do
      local c = cursors[k]
      if i < c.idx then
        c.idx = c.idx - 1
      end
      -- Only the entry just before the cursor (i was idx-1) or at it (i was idx) changed.
      if i == c.idx then
        c.before, c.after = NO_TIME_BEFORE, NO_TIME_AFTER
        if c.idx > 0 then
          c.before = g.entry_at(log, c.idx - 1)
        end
        if c.idx < log.count then
          c.after = g.entry_at(log, c.idx)
        end
      end
    end
    log.dirty = true
  end

  -- compact keeps refunded entries from piling up, after live entry i was refunded in full: it
  -- joins it with the refunded entries of its microsecond beside it into one run, and takes
  -- the run out when no later entry's seq counts on it (it is the last of its microsecond) and
  -- no append can take its seqs (the header's newest and seq stand for the newest microsecond).
  -- So refunded entries never outnumber the entries that carry events, plus one, however many
  -- requests were refunded, and the identities (time, seq) of the others do not move.
  function g.compact(log, i)
    local t, _, span = g.entry_at(log, i)
    span = span or 1
    if i + 1 < log.count then
      local nt, nc, ns = g.entry_at(log, i + 1)
      if nt == t and nc == 0 and span + (ns or 1) <= 65535 then
        span = span + (ns or 1)
        g.remove(log, i + 1)
        g.set_cost(log, i, 0, span)
      end
    end
    if i > 0 then
      local pt, pc, ps = g.entry_at(log, i - 1)
      if pt == t and pc == 0 and span + (ps or 1) <= 65535 then
        span = span + (ps or 1)
        g.remove(log, i)
        i = i - 1
        g.set_cost(log, i, 0, span)
      end
    end
    if t < log.newest and (i + 1 >= log.count or g.entry_at(log, i + 1) > t) then
      g.remove(log, i)
    end
    -- A refunded run left at the end is of the newest microsecond: the next append of a later
    -- one takes it out (insert), and the header says so, so that it need not be read to know.
    log.tail_refunded = false
    if log.count > 0 then
      local _, last_cost = g.entry_at(log, log.count - 1)
      log.tail_refunded = last_cost == 0
    end
    log.dirty = true
  end

  -- trim takes the entries whose time is at or before cutoff out of the log: they have left
  -- every window. A log whose every entry left is deleted whole, and save writes it anew.
  function g.trim(log, cutoff)
    if log.count == 0 or log.newest <= cutoff then
      if log.exists and log.count + log.gone > 0 then
        redis.call('DEL', log.key)
        log.exists, log.total, log.count, log.gone, log.closed = false, 0, 0, 0, 0
        log.tail_refunded = false
        log.newest, log.seq, log.open, log.dirty = NO_TIME_BEFORE, 0, '', true
        local cursors = log.cursors
        for k = 1, #cursors do
          local c = cursors[k]
          c.idx, c.partial, c.before, c.after = 0, 0, NO_TIME_BEFORE, NO_TIME_AFTER
        end
      end
      return
    end
    local dropped, cost = 0, 0
    if log.closed > 0 then
      if log.oldest > cutoff then
        return
      end
      dropped, cost = g.trim_closed(log, cutoff)
    end
    local after
    if log.closed == 0 then
      -- The open chunk, read in place: drop its entries up to cutoff.
      local s, pos = log.open, 1
      while true do
        local t, c, next_pos = read_entry(s, pos)
        if t > cutoff then
          after = t
          break
        end
        dropped, cost, pos = dropped + 1, cost + c, next_pos
      end
      if pos > 1 then
        log.open, log.open_ts = string.sub(s, pos), nil
      end
    else
      after = log.oldest
    end
    if dropped == 0 then
      return
    end
    log.total = log.total - cost
    log.count = log.count - dropped
    g.shift_cursors(log, dropped, cost, after)
    log.dirty = true
  end

  -- insert adds an entry of cost at time t, after every entry at or before t, and returns its
  -- seq.
  function g.insert(log, t, cost)
    local p, seq
    if log.count == 0 or t >= log.newest then
      if log.tail_refunded and t > log.newest then
        -- The refunded run at the end is no longer of the newest microsecond: no append can
        -- take its seqs now, and no later entry counts on them (see compact).
        g.remove(log, log.count - 1)
      end
      log.tail_refunded = false
      p, seq = log.count, 1
      if log.count > 0 and t == log.newest then
        seq = log.seq + 1
      end
      log.newest, log.seq = t, seq
      if log.count - log.closed >= OPEN_CHUNK_MAX then
        g.flush(log)
      end
      log.open, log.open_ts = log.open .. make_entry(t, cost), nil
    else
      p, seq = g.insert_before(log, t, cost)
    end
    local cursors = log.cursors
    for k = 1, #cursors do
      local c = cursors[k]
      if p < c.idx then
        c.idx = c.idx + 1
        c.partial = c.partial + cost
      elseif p == c.idx then
        c.after = t
      end
    end
    log.total = log.total + cost
    log.count = log.count + 1
    log.dirty = true
    return seq
  end

  -- merge_slot adds cost to the entry of time t that carries events (a slot's entry:
  -- Resolution), when one is among the newest few (callers' clocks may be a little out of
  -- step), and returns its seq; nil, having changed nothing, when there is none.
  function g.merge_slot(log, t, cost)
    if log.count == 0 or t > log.newest then
      return nil
    end
    local from = log.count - 8
    if from < 0 then
      from = 0
    end
    local ts, cs, ss = g.entries(log, from, log.count - 1)
    for j = #ts, 1, -1 do
      if ts[j] < t then
        return nil
      elseif ts[j] == t and cs[j] > 0 and cs[j] + cost <= 2147483647 then
        -- Its seq: one past the seqs of the entries of t before it (runs stand for theirs).
        local seq, k = 1, j - 1
        while k >= 1 and ts[k] == t do
          seq, k = seq + (ss[k] or 1), k - 1
        end
        if k < 1 and from > 0 then
          return nil -- more entries of t than read: append instead
        end
        local i = from + j - 1
        g.set_cost(log, i, cs[j] + cost)
        local cursors = log.cursors
        for c = 1, #cursors do
          if i < cursors[c].idx then
            cursors[c].partial = cursors[c].partial + cost
          end
        end
        log.total = log.total + cost
        log.dirty = true
        return seq
      end
    end
    return nil
  end

  -- decide judges a request of n events at now against limits (decide.lua documents them: the
  -- sliding limits' (window, max) pairs, windows ascending, with the resolution and the
  -- calendar limits, as g.view reads them), and records it when every limit has room. write
  -- false only judges (a peek): nothing moves, and the longest window skips the entries that
  -- have left it instead of trimming them. It returns the least room left (after recording),
  -- the 1-based position of the limit it belongs to (the shortest window among equals; the
  -- calendar limits follow the sliding ones), the wait until every limit has room for n (0:
  -- admitted), the events in the longest window before recording, the entry's seq (0 when
  -- the request records no entry: calendar limits alone), and quota_after: the wait until
  -- the first event in that limit's window (after recording) leaves it, or its period ends,
  -- 0 when the window holds none.
  --
  -- With a resolution, the entry is recorded at the end of its slot, now rounded up to a
  -- multiple of res, and joins the entry of that slot (g.merge_slot) when there is one: it counts at
  -- least as long as the request would, so no window ever admits more than its max, and at
  -- most res longer. A reservation (a hold, the engine's local quota) is recorded at now +
  -- hold (then rounded up to its slot): every admission made from it happens in [now, now +
  -- hold], so its entry counts at least as long as each of them would, by the same argument.
  -- Calendar limits count their period's counter (see above).
  function g.decide(log, now, n, limits, write)
    local sliding, res, cals, hold = g.view(limits)
    local last = #sliding / 2
    -- The log keeps every entry the longest window ever counted on the key still counts
    -- (its horizon), so that no limit on the key ever trims what another one counts.
    local reach = log.horizon
    if last > 0 and sliding[2 * last - 1] > reach then
      reach = sliding[2 * last - 1]
    end
    if write then
      g.trim(log, now - reach)
      if reach > log.horizon then
        log.horizon, log.dirty, log.horizon_grew = reach, true, true
      end
    end
    local remaining, tightest, retry_after, count = nil, 1, 0, 0
    local tfirst, tcount, twindow = 0, 0, 0 -- the tightest limit's first entry, events, window
    local tends = nil -- the tightest limit's period end, when it is a calendar limit
    for i = 1, last do
      local window, max = sliding[2 * i - 1], sliding[2 * i]
      local first = 0
      count = log.total
      if i < last or not write or window < reach then
        local c = g.cursor(log, window, now, write)
        count, first = log.total - c.partial, c.idx
      end
      if remaining == nil or max - count < remaining then
        remaining, tightest = max - count, i
        tfirst, tcount, twindow = first, count, window
      end
      if count + n > max then
        local wait = g.covering(log, first, count + n - max, count) + window - now
        if wait > retry_after then
          retry_after = wait
        end
      end
    end
    local periods = {}
    for j = 1, #cals do
      local cal = cals[j]
      local start, stop = g.period(cal, now)
      periods[j] = {start, stop}
      local c, held = g.counter(log, start, stop), 0
      if c ~= nil then
        held = c.events
        c.used = true
      elseif g.ended(log, stop) then
        -- A caller's clock behind the others': its period ended on this key, and its count
        -- may be gone. Deny until it ends, as a sliding log denies early, never late.
        held = cal[1]
      end
      if remaining == nil or cal[1] - held < remaining then
        remaining, tightest, tcount, tends = cal[1] - held, last + j, held, stop
      end
      if held + n > cal[1] and stop - now > retry_after then
        retry_after = stop - now
      end
    end
    -- The first event in the tightest window: from its first entry on, skipping refunded ones.
    local quota_after = 0
    if tends ~= nil then
      if tcount > 0 then
        quota_after = tends - now
      end
    elseif tcount > 0 then
      quota_after = g.covering(log, tfirst, 1, tcount) + twindow - now
    end
    if retry_after > 0 or not write then
      if remaining < 0 then
        remaining = 0
      end
      return remaining, tightest, retry_after, count, 0, quota_after
    end
    -- The new entry is in the window too, and older than every entry a clock ahead recorded.
    if tends ~= nil then
      quota_after = tends - now
    elseif tcount == 0 or quota_after > twindow then
      quota_after = twindow
    end
    -- The counters: every period this request counts in gets one, and every counter whose
    -- period holds now counts the request, whatever limit made it.
    for j = 1, #periods do
      local start, stop = periods[j][1], periods[j][2]
      if g.counter(log, start, stop) == nil then
        g.drop_before(log, start)
        log.counters[#log.counters + 1] = {start = start, stop = stop, events = 0, used = true}
        log.dirty = true
      end
    end
    g.count_in(log, now, n)
    local t = now + hold
    if res > 0 and t % res ~= 0 then
      t = t - t % res + res
    end
    if log.exists then
      -- The expiry the key needs once the entry is in, set before it goes in: a server that
      -- refuses it refuses before anything is recorded.
      local until_us = g.reset_at(log, log.horizon)
      if last > 0 and math.max(log.newest, t) + log.horizon > until_us then
        until_us = math.max(log.newest, t) + log.horizon
      end
      keep_log_until(log.key, now, until_us, log.server_clock)
      log.expiry_set = true
    end
    local seq = 0
    if last > 0 then
      if res > 0 then
        seq = g.merge_slot(log, t, n)
      end
      if seq == nil or seq == 0 then
        seq = g.insert(log, t, n)
      end
    end
    return remaining - n, tightest, 0, count, seq, quota_after
  end

  return g
end
