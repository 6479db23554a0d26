-- lib_cursor.lua: a part of the general path, included in general()'s body (lib_log.lua),
-- where g is the table of its functions: a window's cursor (lib_log.lua: window, idx,
-- partial, before, after), where the window starts among the live entries. A cursor moves
-- only as far as the clock did since it was last used, reading the entries it passes
-- (lib_entries.lua), so that counting a window shorter than the horizon costs amortized O(1).

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

-- move puts cursor c at bound: entries [0, c.idx) have times at or before bound, the rest
-- after it. It reports whether c moved.
function g.move(log, c, bound)
  local moved = false
  local chunk = 4
  while c.after <= bound do
    if chunk > 4 and g.unit_after(log, bound) then
      -- More to pass than the first read held, and every entry after bound costs 1: the
      -- cursor goes to the first entry after bound, found by its time (seek), and the entries
      -- before it cost what the log holds less one event each for those after it.
      local idx, t = g.seek(log, c.idx, bound)
      c.idx, c.partial, c.after, c.before = idx, log.total - (log.count - idx), t or NO_TIME_AFTER, NO_TIME_BEFORE
      if idx > 0 then
        c.before = g.entry_at(log, idx - 1)
      end
      moved = true
      break
    end
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
