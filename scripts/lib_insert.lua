-- lib_insert.lua: a part of the general path, included in general()'s body (lib_log.lua),
-- where g is the table of its functions: an entry comes into a log. insert appends it (or,
-- from a caller's clock behind another's, puts it after the entries at or before its time),
-- flushing a full open chunk behind the header; merge_slot adds a slot's cost to the slot's
-- entry instead (lib_log.lua, Slots). Both keep the totals and the cursors right. Then the
-- two edits of one entry in place that these and a refund (lib_refund.lua) make: set_cost,
-- which leaves the totals to its caller, and remove, of an entry that carries no events.

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
  g.weigh(log, t, cost)
  log.total = log.total + cost
  log.count = log.count + 1
  log.dirty = true
  return seq
end

-- weigh notes an entry of time t that now costs cost: one that is not of cost 1 moves
-- last_weighted up to it (lib_log.lua).
function g.weigh(log, t, cost)
  if cost ~= 1 and t > log.last_weighted then
    log.last_weighted = t
  end
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

-- set_cost rewrites live entry i's cost; with span, it becomes a refunded run of span seqs
-- (cost 0).
function g.set_cost(log, i, cost, span)
  local t = g.entry_at(log, i)
  g.weigh(log, t, cost)
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
