-- lib_trim.lua: a part of the general path, included in general()'s body (lib_log.lua),
-- where g is the table of its functions: trim, the entries that have left every window
-- counted on the key (its horizon) taken out of the log, from its front: the open chunk's
-- in place, the closed ones counted gone and dropped a few at a time by LTRIM; the cursors
-- stay on their entries.

-- trim takes the entries whose time is at or before cutoff out of the log: they have left
-- every window. A log whose every entry left is deleted whole, and save writes it anew.
function g.trim(log, cutoff)
  if log.count == 0 or log.newest <= cutoff then
    if log.exists and log.count + log.gone > 0 then
      redis.call('DEL', log.key)
      log.exists, log.total, log.count, log.gone, log.closed = false, 0, 0, 0, 0
      log.tail_refunded, log.last_weighted = false, NO_TIME_BEFORE
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

-- trim_closed is trim's part for a log with closed entries: it drops them (and, when they
-- all left, the open chunk's) up to cutoff, and returns how many left and their cost.
function g.trim_closed(log, cutoff)
  local dropped, cost, chunk = 0, 0, 4
  while dropped < log.closed do
    if chunk > 4 and g.unit_after(log, cutoff) then
      -- More left than the first read held, and every entry after cutoff costs 1: the first
      -- that stays is found by its time (seek), and what left costs what the log holds less
      -- the closed entries that stay (one event each) and the open chunk.
      local j, t = g.seek(log, dropped, cutoff)
      if j > log.closed then
        j = log.closed -- every closed entry left; trim goes on into the open chunk
      end
      cost = log.total - (log.closed - j) - g.open_total(log)
      dropped = j
      if j < log.closed then
        log.oldest, log.oldest_cost = t, 1
      end
      break
    end
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
