-- llmfab's parking hook for HAProxy (loaded by the endpoint's haproxy.cfg: `lua-load`).
--
-- HAProxy routes (by the request's `model`, haproxy.cfg); this file parks, wakes and switches.
-- A parked member is its backend's server in maintenance: HAProxy sends it nothing. A request
-- for it runs `llmfab_wake` first: POST /wake_up on the member, then the known greedy
-- completion, compared with the one recorded when the member was first seen awake; only when
-- it matches does the server leave maintenance and the request go on (its wait is the wake).
-- A member idle for its idle_s is parked by the task below: POST /sleep?level=1, then
-- maintenance. Level 1 only: level 2 discards the weights (empty text after a wake).
-- Each member has two slots (servers `a` and `b` of its backend: its port and its swap port);
-- one serves (`live`), the other is where a new release starts. /switch moves traffic to the
-- other slot once it answers a real completion; the old server goes into maintenance, which
-- lets its requests in flight finish (the drain). The live slots are kept in ../../live.lua
-- (the router's deployment directory), so a restarted or redeployed router serves the same.
-- The admin service (a loopback-only port) answers `fab sleep`, `fab wake`, `fab status` and
-- the endpoint's deploy and rollback.
-- Members come from members.lua beside haproxy.cfg (written by llmfab).

local M = dofile("members.lua")  -- {name = {backend, addr, ports = {a, b}, idle_s, check, expect}}
local LIVE_FILE = "../../live.lua"  -- {name = "a" | "b"}
local DRAIN_S = 300  -- the longest a park waits for the member's requests in flight to finish
local state = {}  -- name -> {live, asleep, held, last_use, expect, expects, waking, wakes, ...}

local ok_live, saved = pcall(dofile, LIVE_FILE)
if not ok_live or type(saved) ~= "table" then saved = {} end

for name, m in pairs(M) do
  local live = (saved[name] == "b" and m.ports.b ~= 0) and "b" or "a"
  state[name] = {live = live, asleep = false, held = nil, last_use = core.now().sec,
                 expect = (live == "a") and m.expect or nil, expects = {a = m.expect},
                 waking = false, wakes = 0, sleeps = 0, switches = 0, last_wake_s = nil,
                 last_sleep_s = nil, last_switch_s = nil, error = nil}
end

local function persist()
  local lines = {"return {"}
  for name, st in pairs(state) do
    lines[#lines + 1] = string.format("  [%q] = %q,", name, st.live)
  end
  lines[#lines + 1] = "}"
  local f = io.open(LIVE_FILE .. ".tmp", "w")
  if not f then return end
  f:write(table.concat(lines, "\n") .. "\n")
  f:close()
  os.rename(LIVE_FILE .. ".tmp", LIVE_FILE)
end

local function now()
  local t = core.now()
  return t.sec + t.usec / 1e6
end

local function server_of(name, slot)
  return core.backends[M[name].backend].servers[slot or state[name].live]
end

local function call(name, method, path, body, timeout_ms, slot)
  local m = M[name]
  local hc = core.httpclient()
  local port = m.ports[slot or state[name].live]
  local req = {url = "http://" .. m.addr .. ":" .. port .. path, timeout = timeout_ms or 30000,
               headers = {["content-type"] = {"application/json"}}}
  if body then req.body = body end
  local r
  if method == "POST" then r = hc:post(req) else r = hc:get(req) end
  return r
end

-- The text of the member's known greedy completion, as the engine encodes it (no JSON
-- library in HAProxy's Lua: the raw string between the quotes is compared, byte for byte).
local function check_text(name, slot)
  local r = call(name, "POST", "/v1/completions", M[name].check, 60000, slot)
  if not r or r.status ~= 200 or not r.body then
    return nil, "check completion answered " .. tostring(r and r.status)
  end
  local text = string.match(r.body, '"text"%s*:%s*"(.-)"%s*[,}]')
  if text == nil then return nil, "check completion had no text" end
  return text, nil
end

local function park(name)
  local st = state[name]
  if st.asleep then return true, nil end
  local srv = server_of(name)
  srv:set_maint()  -- nothing new is sent to it from here on
  local t0 = now()
  -- The requests in flight finish first: vLLM's sleep aborts what runs (its default mode
  -- "abort"; on the H200 every stream in flight was cut when it slept).
  local deadline = now() + DRAIN_S
  while (tonumber(srv:get_stats()["scur"] or "0") or 0) > 0 and now() < deadline do core.msleep(20) end
  local r = call(name, "POST", "/sleep?level=1", "", 60000)
  if not r or r.status ~= 200 then
    srv:set_ready()
    st.error = "sleep answered " .. tostring(r and r.status)
    return false, st.error
  end
  st.asleep, st.sleeps, st.last_sleep_s, st.error = true, st.sleeps + 1, now() - t0, nil
  return true, nil
end

local function wake(name)
  local st = state[name]
  if not st.asleep then return true, nil end
  if st.waking then  -- another request wakes it: wait for that one
    local deadline = now() + 120
    while st.waking and now() < deadline do core.msleep(5) end
    if st.asleep then return false, st.error or "wake timed out" end
    return true, nil
  end
  st.waking = true
  local t0 = now()
  local r = call(name, "POST", "/wake_up", "", 120000)
  local ok, err = (r and r.status == 200), nil
  if not ok then err = "wake_up answered " .. tostring(r and r.status) end
  if ok then
    local text, cerr = check_text(name)
    if text == nil then ok, err = false, cerr
    elseif st.expect ~= nil and text ~= st.expect then
      ok, err = false, "after the wake the known greedy completion differs from the one recorded at ready ("
        .. string.format("%q", string.sub(text, 1, 80)) .. " against " .. string.format("%q", string.sub(st.expect, 1, 80)) .. ")"
    elseif st.expect == nil then st.expect = text end
  end
  if ok then
    st.asleep, st.wakes, st.last_wake_s, st.error = false, st.wakes + 1, now() - t0, nil
    server_of(name):set_ready()
  else
    st.error = err
  end
  st.waking = false
  return ok, err
end

-- Traffic to slot `to`: woken first if it sleeps (a rollback to a parked release), then its
-- known greedy completion (a real completion: a woken one must match what it gave before),
-- then its server ready and the old one in maintenance (its requests in flight finish).
local function switch(name, to)
  local st, m = state[name], M[name]
  if to ~= "a" and to ~= "b" or m.ports[to] == 0 then return false, "no slot " .. tostring(to) end
  if to == st.live and not st.asleep then st.held = nil; return true, nil end
  local woke = false
  local r = call(name, "GET", "/is_sleeping", nil, 5000, to)
  if r and r.status == 200 and string.find(r.body or "", "true", 1, true) then
    r = call(name, "POST", "/wake_up", "", 120000, to)
    if not r or r.status ~= 200 then return false, "slot " .. to .. ": wake_up answered " .. tostring(r and r.status) end
    woke = true
  elseif not r or r.status ~= 200 then
    return false, "slot " .. to .. " does not answer (" .. tostring(r and r.status) .. ")"
  end
  local text, cerr = check_text(name, to)
  if text == nil then return false, "slot " .. to .. ": " .. cerr end
  if woke and st.expects[to] ~= nil and text ~= st.expects[to] then
    return false, "slot " .. to .. ": after the wake the known greedy completion differs from the one it gave before"
  end
  st.expects[to] = text
  server_of(name, to):set_ready()
  if to ~= st.live then
    server_of(name, st.live):set_maint()
    st.other_parked = st.asleep  -- the slot it leaves: parked (a rollback target) or to be stopped
  end
  st.live, st.expect, st.asleep, st.held, st.error = to, text, false, nil, nil
  st.switches = st.switches + 1
  persist()
  return true, nil
end

core.register_action("llmfab_wake", {"http-req"}, function(txn)
  local name = txn:get_var("txn.member")
  local st = name and state[name]
  if not st then return end
  st.last_use = core.now().sec
  if st.held then
    txn:set_var("txn.wake_error", st.held)
  elseif st.asleep then
    local ok, err = wake(name)
    txn:set_var("txn.wake_error", ok and "" or err)
  end
end, 0)

-- Idle parking and the first record of each member's check completion.
core.register_task(function()
  for name, st in pairs(state) do  -- the live slots (live.lua), before anything else
    if M[name].ports.b ~= 0 then
      server_of(name, st.live):set_ready()
      server_of(name, st.live == "a" and "b" or "a"):set_maint()
    end
  end
  while true do
    for name, m in pairs(M) do
      local st = state[name]
      if st.expect == nil and not st.asleep then
        local r = call(name, "GET", "/is_sleeping", nil, 5000)
        if r and r.status == 200 and string.find(r.body or "", "true", 1, true) then
          st.asleep = true
          server_of(name):set_maint()
        elseif r and r.status == 200 then
          st.expect = check_text(name)
        end
      end
      if m.idle_s and m.idle_s > 0 and not st.asleep and not st.waking then
        local busy = tonumber(server_of(name):get_stats()["scur"] or "0") or 0
        if busy == 0 and core.now().sec - st.last_use >= m.idle_s then park(name) end
      end
    end
    core.sleep(1)
  end
end)

local function q(s)  -- a JSON string
  return '"' .. string.gsub(tostring(s), '[%c"\\]', function(c)
    return string.format("\\u%04x", string.byte(c)) end) .. '"'
end

local function state_json()
  local parts = {}
  for name, st in pairs(state) do
    local fields = {
      '"asleep":' .. tostring(st.asleep), '"last_use":' .. st.last_use,
      '"wakes":' .. st.wakes, '"sleeps":' .. st.sleeps,
      '"recorded":' .. tostring(st.expect ~= nil),
      '"idle_s":' .. tostring(M[name].idle_s or 0), '"slot":' .. q(st.live),
      '"switches":' .. st.switches, '"other_parked":' .. tostring(st.other_parked == true)}
    local slots = {}
    for _, slot in ipairs({"a", "b"}) do
      if M[name].ports[slot] ~= 0 then
        local stats = server_of(name, slot):get_stats()
        slots[#slots + 1] = q(slot) .. ':{"port":' .. M[name].ports[slot] .. ',"scur":'
          .. (tonumber(stats["scur"] or "0") or 0) .. ',"status":' .. q(stats["status"] or "?") .. '}'
      end
    end
    fields[#fields + 1] = '"slots":{' .. table.concat(slots, ",") .. '}'
    if st.held then fields[#fields + 1] = '"held":' .. q(st.held) end
    if st.last_wake_s then fields[#fields + 1] = '"last_wake_s":' .. string.format("%.3f", st.last_wake_s) end
    if st.last_sleep_s then fields[#fields + 1] = '"last_sleep_s":' .. string.format("%.3f", st.last_sleep_s) end
    if st.error then fields[#fields + 1] = '"error":' .. q(st.error) end
    parts[#parts + 1] = q(name) .. ":{" .. table.concat(fields, ",") .. "}"
  end
  return "{" .. table.concat(parts, ",") .. "}"
end

-- Admin: GET /state; POST /sleep?member=NAME[&hold=1]; POST /wake?member=NAME;
-- POST /switch?member=NAME&to=a|b (loopback port only). `hold`: a request for the parked member
-- is answered 503 (its new release is starting in the other slot) instead of waking it.
core.register_service("llmfab_admin", "http", function(applet)
  local code, body = 200, nil
  local name = string.match(applet.qs or "", "member=([^&]+)")
  if applet.path == "/state" then
    body = state_json()
  elseif (applet.path == "/sleep" or applet.path == "/wake" or applet.path == "/switch") and applet.method == "POST" then
    if not name or not M[name] then
      code, body = 404, '{"error":' .. q("no member " .. tostring(name)) .. '}'
    else
      local t0 = now()
      local ok, err
      if applet.path == "/sleep" then
        ok, err = park(name)
        if ok and string.find(applet.qs or "", "hold=1", 1, true) then
          state[name].held = "its new release is starting in the other slot (the two do not fit the GPU together)"
        end
      elseif applet.path == "/switch" then
        ok, err = switch(name, string.match(applet.qs or "", "to=([ab])"))
      else
        state[name].held = nil
        ok, err = wake(name)
      end
      if ok then body = '{"ok":true,"seconds":' .. string.format("%.3f", now() - t0) .. '}'
      else code, body = 502, '{"ok":false,"error":' .. q(err) .. '}' end
    end
  else
    code, body = 404, '{"error":"no such admin path"}'
  end
  applet:set_status(code)
  applet:add_header("content-type", "application/json")
  applet:add_header("content-length", string.len(body))
  applet:start_response()
  applet:send(body)
end)
