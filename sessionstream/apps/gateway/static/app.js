// The console: sessions list, a session's live run timeline with the send box and the
// steer / follow-up / abort buttons, the queue of waiting tasks with a remove button each,
// and the stats page. State comes from the gateway's
// API: the session and its runs from PostgreSQL, then live events over SSE from the last
// offset PostgreSQL had, and each command's own outcome events from its POST.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const S = {
    session: null,       // the open session id
    events: new Map(),   // "runId/seq" -> event, for the open session
    schedules: new Map(),  // scheduleId -> its definition and next firing, for the open session
    runs: [],            // run ids in start order
    current: null,       // the run the timeline shows
    follow: true,        // switch to a newly started run
    queue: [],          // waiting tasks in start order: {id, kind, text, actor, queuedAt}
    stop: null,          // stops the live stream
    skew: 0,             // event clock - this browser's clock
    tick: null,
    listStatus: null,    // the open session's status for the list, from its live events
    answers: new Map(),  // "runId/callId" -> {seq, text, done}: token deltas (a view)
    answerOf: new Map(), // runId -> its latest model call's "runId/callId"
  };

  // -- key ------------------------------------------------------------------------------
  // A key given in the URL's fragment (`/#key=ssk_...`, as `make demo` prints it: a
  // fragment never reaches a server or its logs) is kept and dropped from the address bar
  // and the history. `?key=` of older links still works, but it did reach the server.
  function keyFromUrl() {
    const url = new URL(location.href);
    let k = null;
    if (url.hash.startsWith("#key=")) {
      k = decodeURIComponent(url.hash.slice(5));
      url.hash = "";
    } else if (url.searchParams.get("key")) {
      k = url.searchParams.get("key");
      url.searchParams.delete("key");
    }
    if (k) {
      Api.setKey(k);
      history.replaceState(null, "", url.pathname + url.search + url.hash);
    }
  }

  async function login() {
    const r = Api.key() ? await Api.call("GET", "/v1/whoami") : { status: 401 };
    if (r.status !== 200) {
      $("login").hidden = false;
      $("sessions-page").hidden = $("stats-page").hidden = true;
      $("key-error").textContent = Api.key() ? "that key is not accepted" : "";
      return false;
    }
    $("login").hidden = true;
    $("whoami").textContent = `tenant ${r.data.tenantId} · ${r.data.actor}`;
    $("stats-tenant").textContent = "tenant " + r.data.tenantId;
    return true;
  }

  $("key-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    Api.setKey($("key-input").value.trim());
    if (await login()) route();
  });
  $("change-key").addEventListener("click", () => { Api.setKey(null); login(); });

  // -- routing --------------------------------------------------------------------------
  function route() {
    const h = location.hash || "#/sessions";
    const stats = h.startsWith("#/stats");
    $("sessions-page").hidden = stats;
    $("stats-page").hidden = !stats;
    $("nav-sessions").classList.toggle("active", !stats);
    $("nav-stats").classList.toggle("active", stats);
    if (stats) { loadStats(); return; }
    const m = h.match(/^#\/sessions\/(.+)$/);
    if (m) openSession(decodeURIComponent(m[1]));
    loadSessions();
  }
  window.addEventListener("hashchange", route);

  // -- sessions -------------------------------------------------------------------------
  async function loadSessions() {
    const r = await Api.call("GET", "/v1/sessions?limit=100");
    if (r.status !== 200) return;
    const ul = $("session-list");
    ul.textContent = "";
    for (const s of r.data.sessions) {
      if (s.sessionId === S.session && S.listStatus) s.status = S.listStatus;
      const li = document.createElement("li");
      li.dataset.session = s.sessionId;
      li.classList.toggle("selected", s.sessionId === S.session);
      li.innerHTML = `<span class="sid"></span><span class="badge" data-status="${s.status}">${s.status}</span>`;
      li.querySelector(".sid").textContent = s.sessionId;
      li.addEventListener("click", () => { location.hash = "#/sessions/" + encodeURIComponent(s.sessionId); });
      ul.appendChild(li);
    }
  }

  $("new-session").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const id = $("new-session-id").value.trim() || "s-" + Math.random().toString(36).slice(2, 10);
    $("new-session-id").value = "";
    location.hash = "#/sessions/" + encodeURIComponent(id);
  });

  async function openSession(id) {
    if (S.session === id) return;
    if (S.stop) S.stop();
    Object.assign(S, { session: id, events: new Map(), runs: [], current: null, follow: true, queue: [],
                       listStatus: null, answers: new Map(), answerOf: new Map(), schedules: new Map() });
    $("session").hidden = false;
    $("session-title").textContent = id;
    $("outcomes").textContent = "";
    $("events").textContent = "";
    const r = await Api.call("GET", "/v1/sessions/" + encodeURIComponent(id));
    let last = null;
    if (r.status === 200) {
      const st = r.data;
      last = st.lastEventId;
      S.queue = st.queue.map((q) => ({ id: q.sourceCommandId, kind: q.kind, text: q.text,
                                       actor: q.actor, queuedAt: q.queuedAt }));
      const runs = st.runs.slice().reverse();  // oldest first
      S.runs = runs.map((x) => x.runId);
      const show = st.activeRun ? st.activeRun.runId : (runs.length ? runs[runs.length - 1].runId : null);
      if (show) await loadRun(show);
      S.current = show;
    }
    $("schedules").textContent = "";
    loadSchedules();
    // live from what PostgreSQL had; a session it has not seen yet: from now on
    S.stop = Api.streamSession(id, last, (ev) => {
      if (ev.event === "model.delta") { delta(ev.data); return; }
      S.skew = ev.data.ts - Date.now();
      add(ev.data, ev.id);
    }, (on) => { $("live").classList.toggle("on", on); $("live").dataset.on = on ? "1" : "0"; });
    draw();
  }

  // the session's schedules and their next firing: PostgreSQL's list, then the live
  // schedule.* events (each carries the times it computed: nothing is computed here)
  async function loadSchedules() {
    const id = S.session;
    const r = await Api.call("GET", `/v1/sessions/${encodeURIComponent(id)}/schedules`);
    if (id !== S.session || r.status !== 200) return;
    for (const sc of r.data.schedules) if (!S.schedules.has(sc.scheduleId)) S.schedules.set(sc.scheduleId, sc);
    drawSchedules();
  }

  function scheduleEvent(e) {
    const p = e.payload;
    if (e.type === "schedule.deleted") S.schedules.delete(p.scheduleId);
    else if (e.type === "schedule.fired") {
      const sc = S.schedules.get(p.scheduleId);
      if (sc) sc.nextAt = p.nextAt;
    } else S.schedules.set(p.scheduleId, { ...p });
    drawSchedules();
  }

  function drawSchedules() {
    const ul = $("schedules");
    ul.textContent = "";
    for (const sc of S.schedules.values()) {
      const li = document.createElement("li");
      li.dataset.schedule = sc.scheduleId;
      const when = sc.cron ? `cron "${sc.cron}" ${sc.timezone}` : `every ${sc.intervalMs / 1000} s`;
      const next = new Date(sc.nextAt).toLocaleString();
      li.textContent = `⏰ ${sc.scheduleId}: ${when}, next ${next} — ${sc.text.slice(0, 60)}`;
      li.title = `overlap ${sc.overlap}, catch-up ${sc.catchUp}, jitter ${sc.jitterMs} ms`;
      ul.append(li);
    }
  }

  async function loadRun(runId) {
    const r = await Api.call("GET", `/v1/runs/${encodeURIComponent(runId)}/events`);
    if (r.status === 200) for (const e of r.data.events) add(e, e.offset, true);
  }

  // a piece of a model call's answer as it streams: live only, in `seq` order; the
  // finished call (model.request.finished) closes it
  function delta(d) {
    const k = d.runId + "/" + d.callId;
    const a = S.answers.get(k) || { seq: 0, text: "", done: false };
    if (a.done || d.seq <= a.seq) return;
    a.text += (d.seq > a.seq + 1 ? " … " : "") + d.text;  // a gap: a delta was dropped
    a.seq = d.seq;
    S.answers.set(k, a);
    S.answerOf.set(d.runId, k);
    drawAnswer();
  }

  function drawAnswer() {
    const k = S.current ? S.answerOf.get(S.current) : null;
    const a = k ? S.answers.get(k) : null;
    $("answer-wrap").hidden = !a;
    if (!a) return;
    $("answer").textContent = a.text;
    $("answer").dataset.state = a.done ? "done" : "streaming";
    $("answer-state").textContent = a.done ? "(finished)" : "(streaming…)";
  }

  function add(e, offset, quiet) {
    const k = e.runId + "/" + e.seq;
    if (S.events.has(k)) return;
    S.events.set(k, e);
    if (e.runId !== "_session" && !S.runs.includes(e.runId)) S.runs.push(e.runId);
    // the queue follows the log: queued (an interrupt at the front), started or removed
    const src = e.payload && e.payload.sourceCommandId;
    if (e.type === "run.queued" && !S.queue.some((q) => q.id === src)) {
      const q = { id: src, kind: e.payload.kind, text: e.payload.text, actor: e.payload.actor,
                  queuedAt: e.ts };
      if (e.payload.front) S.queue.unshift(q); else S.queue.push(q);
    }
    if ((e.type === "run.started" && e.payload.origin === "queued") || e.type === "run.dequeued") {
      S.queue = S.queue.filter((q) => q.id !== src);
    }
    if (e.type === "run.started" && S.follow) S.current = e.runId;
    if (!quiet && (e.type === "run.started" || e.type === "run.finished")) {
      setTimeout(loadSessions, 300);  // the list comes from PostgreSQL: a moment behind
    }
    if (e.type.startsWith("schedule.")) scheduleEvent(e);
    if (!S.current && e.runId !== "_session") S.current = e.runId;
    if (e.type === "model.request.finished") {
      const a = S.answers.get(e.runId + "/" + e.payload.callId);
      if (a) { a.done = true; if (!quiet) drawAnswer(); }
    }
    const li = document.createElement("li");
    li.textContent = `${offset ?? ""} ${e.type} ${e.runId.slice(0, 8)} #${e.seq} gen ${e.generation}`;
    $("events").prepend(li);
    if (!quiet) draw();
  }

  // what the run's model requests reported (model.request.finished), summed
  function usage(evs) {
    let n = 0, tin = 0, tout = 0, cost = null;
    for (const e of evs) {
      if (e.type !== "model.request.finished") continue;
      n += 1;
      tin += e.payload.inputTokens || 0;
      tout += e.payload.outputTokens || 0;
      if (e.payload.costUsd != null) cost = (cost || 0) + e.payload.costUsd;
    }
    if (!n) return "";
    const dollars = cost == null ? "" : ` · $${cost.toFixed(4)}`;
    return ` · ${n} model request${n === 1 ? "" : "s"}, ${tin} tokens in / ${tout} out${dollars}`;
  }

  function runEvents(runId) {
    return [...S.events.values()].filter((e) => e.runId === runId);
  }

  function draw() {
    const now = Date.now() + S.skew;
    const evs = S.current ? runEvents(S.current) : [];
    const m = Timeline.render($("timeline"), evs, now);
    const status = S.current ? m.status : "idle";
    $("status").textContent = status;
    $("status").dataset.status = status;
    $("status").dataset.run = S.current || "";
    $("generation").textContent = m.generation ? "generation " + m.generation : "";
    drawAnswer();
    $("queue").textContent = S.queue.length ? `${S.queue.length} queued` : "";
    drawQueue();
    $("legend").textContent = S.current
      ? `run ${S.current} · ${Timeline.fmt(m.end - m.start)}${usage(evs)}` : "no run yet: send a task";
    const picker = $("run-picker");
    picker.textContent = "";
    for (const id of S.runs) {
      const b = document.createElement("button");
      b.type = "button";
      b.textContent = id.slice(0, 8);
      b.className = id === S.current ? "current" : "";
      b.addEventListener("click", async () => {
        S.follow = id === S.runs[S.runs.length - 1];
        if (!runEvents(id).length) await loadRun(id);
        S.current = id;
        draw();
      });
      picker.appendChild(b);
    }
    // the list is PostgreSQL's, a moment behind: the open session's badge follows the log
    // (as in the list: the active run's status, idle once the latest run has finished)
    if (S.current && S.current === S.runs[S.runs.length - 1]) {
      S.listStatus = m.fin ? "idle" : status;
      const badge = document.querySelector("#session-list li.selected .badge");
      if (badge) { badge.textContent = S.listStatus; badge.dataset.status = S.listStatus; }
    }
    const asking = Questions.render($("questions"), evs, now, answer);
    const waiting = Approvals.render($("approvals"), evs, now, decide) || asking;
    const active = S.current && !m.fin;
    $("abort").disabled = !active;
    $("steer").disabled = !active;
    clearTimeout(S.tick);
    if (active || waiting) S.tick = setTimeout(draw, 250);  // open bars grow, time left shrinks
  }

  // the waiting tasks, each with a remove button (DELETE .../queue/{commandId})
  function drawQueue() {
    $("queue-wrap").hidden = !S.queue.length;
    // redrawn only when it changed (draw() runs every 250 ms while a run is active)
    const drawn = S.queue.map((q) => q.id).join("\n");
    const list = $("queue-list");
    if (list.dataset.drawn === drawn && list.dataset.session === S.session) return;
    list.dataset.drawn = drawn;
    list.dataset.session = S.session;
    list.textContent = "";
    for (const q of S.queue) {
      const li = document.createElement("li");
      li.dataset.commandId = q.id;
      const t = document.createElement("span");
      t.className = "text";
      t.textContent = q.text;
      const who = document.createElement("span");
      who.className = "muted";
      const at = q.queuedAt ? new Date(q.queuedAt).toLocaleTimeString() : "";
      who.textContent = `${q.kind} · ${q.actor || "?"} · ${at}`;
      const b = document.createElement("button");
      b.type = "button";
      b.className = "danger small remove";
      b.textContent = "Remove";
      b.title = "remove this task from the queue: it will not start";
      b.addEventListener("click", () => removeQueued(q.id));
      li.append(t, who, b);
      list.appendChild(li);
    }
  }

  async function removeQueued(commandId) {
    const sid = encodeURIComponent(S.session);
    const path = commandId === null
      ? `/v1/sessions/${sid}/queue`
      : `/v1/sessions/${sid}/queue/${encodeURIComponent(commandId)}`;
    outcome(commandId === null ? "clear_queue" : "dequeue", await Api.call("DELETE", path));
  }
  $("clear-queue").addEventListener("click", () => removeQueued(null));

  // -- commands -------------------------------------------------------------------------
  function activeRun() {
    if (!S.current) return null;
    return runEvents(S.current).some((e) => e.type === "run.finished") ? null : S.current;
  }

  async function command(type, payload, runId) {
    const body = { type, payload, commandId: crypto.randomUUID() };
    if (runId) body.runId = runId;
    const r = await Api.call("POST", `/v1/sessions/${encodeURIComponent(S.session)}/commands`, body);
    outcome(type, r);
    if (type === "send" || type === "prompt") setTimeout(loadSessions, 500);
    return r;
  }

  // a command's outcome in the list, and its events into the view
  function outcome(type, r) {
    const li = document.createElement("li");
    const d = r.data || {};
    const status = d.status || (d.error ? d.error.code : "HTTP " + r.status);
    li.className = d.status || "rejected";
    li.dataset.type = type;
    li.textContent = `${type}: ${status}` + (d.runId ? ` run ${d.runId.slice(0, 8)}` : "") +
      (d.reason ? ` (${d.reason})` : "") + (d.error ? ` — ${d.error.message}` : "");
    $("outcomes").prepend(li);
    for (const e of d.events || []) add(e, null);
    draw();
  }

  // a person (the key's actor) decides a pending action of the run shown
  async function decide(a, verb) {
    const runId = S.current;
    const body = { argsDigest: a.digest ?? null, generation: a.generation, commandId: crypto.randomUUID() };
    const path = `/v1/runs/${encodeURIComponent(runId)}/actions/${encodeURIComponent(a.key)}/${verb}`;
    const r = await Api.call("POST", path, body);
    const d = r.data || {};
    const li = document.createElement("li");
    const status = d.status || (d.error ? d.error.code : "HTTP " + r.status);
    li.className = d.status || "rejected";
    li.dataset.type = "action." + verb;
    li.textContent = `${verb} ${a.key}: ${status}` + (d.reason ? ` (${d.reason})` : "") +
      (d.error ? ` — ${d.error.message}` : "");
    $("outcomes").prepend(li);
    for (const e of d.events || []) add(e, null);
    $("approvals").dataset.sig = "";  // rebuilt: a refused decision's buttons come back
    draw();
  }

  // a person (the key's actor) answers an open question of the run shown
  async function answer(q, value) {
    const runId = S.current;
    const body = { answer: value, generation: q.generation, commandId: crypto.randomUUID() };
    const path = `/v1/runs/${encodeURIComponent(runId)}/questions/${encodeURIComponent(q.id)}/answer`;
    const r = await Api.call("POST", path, body);
    const d = r.data || {};
    const li = document.createElement("li");
    const status = d.status || (d.error ? d.error.code : "HTTP " + r.status);
    li.className = d.status || "rejected";
    li.dataset.type = "question.answer";
    li.textContent = `answer ${q.id}: ${status}` + (d.reason ? ` (${d.reason})` : "") +
      (d.error ? ` — ${d.error.message}` : "");
    $("outcomes").prepend(li);
    for (const e of d.events || []) add(e, null);
    $("questions").dataset.sig = "";  // rebuilt: a refused answer's box comes back
    draw();
  }

  function text() { return $("text").value.trim(); }
  $("send-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    if (!text()) return;
    S.follow = true;
    await command("send", { text: text() });
    $("text").value = "";
  });
  $("steer").addEventListener("click", async () => {
    if (!text()) return;
    await command("steer", { text: text() }, activeRun());
    $("text").value = "";
  });
  $("follow-up").addEventListener("click", async () => {
    if (!text()) return;
    await command("follow_up", { text: text() }, activeRun());
    $("text").value = "";
  });
  $("abort").addEventListener("click", () => command("abort", { reason: "user" }, activeRun()));

  // -- stats ----------------------------------------------------------------------------
  let statsTimer = null;
  async function loadStats() {
    clearTimeout(statsTimer);
    if ($("stats-page").hidden) return;
    const minutes = $("stats-minutes").value;
    const r = await Api.call("GET", "/v1/stats?minutes=" + minutes);
    if (r.status !== 200) {
      $("stats-error").textContent = r.data && r.data.error ? r.data.error.message : "HTTP " + r.status;
    } else {
      $("stats-error").textContent = "";
      const s = r.data;
      $("stats-active").textContent = `${s.active.total} active`;
      Charts.stacked($("chart-runs"), s.runs.minutes,
        ["started", "completed", "cancelled", "failed", "timedOut"]);
      Charts.lines($("chart-durations"), s.durations.minutes, ["p50", "p90", "p99"]);
      Charts.lines($("chart-cancel"), s.cancelLatency.minutes, ["p50", "p90", "p99"]);
      const rej = Object.entries(s.rejections.totals[s.tenantId] || {}).sort((a, b) => b[1] - a[1]);
      Charts.hbars($("chart-rejections"), rej);
      table(s);
    }
    statsTimer = setTimeout(loadStats, 5000);
  }
  $("stats-minutes").addEventListener("change", loadStats);

  function table(s) {
    const t = s.runs.totals[s.tenantId] || {};
    const d = s.durations.overall, c = s.cancelLatency.overall;
    const cell = (v) => (v === null || v === undefined ? "–" : v);
    $("stats-table").innerHTML =
      "<tr><th></th><th>started</th><th>completed</th><th>cancelled</th><th>failed</th><th>timed out</th></tr>" +
      `<tr><th>runs</th><td>${cell(t.started)}</td><td>${cell(t.completed)}</td><td>${cell(t.cancelled)}</td>` +
      `<td>${cell(t.failed)}</td><td>${cell(t.timedOut)}</td></tr>` +
      "<tr><th></th><th>n</th><th>p50</th><th>p90</th><th>p99</th><th>max</th></tr>" +
      `<tr><th>duration ms</th><td>${d.count}</td><td>${cell(d.p50)}</td><td>${cell(d.p90)}</td><td>${cell(d.p99)}</td><td>${cell(d.max)}</td></tr>` +
      `<tr><th>cancel latency ms</th><td>${c.count}</td><td>${cell(c.p50)}</td><td>${cell(c.p90)}</td><td>${cell(c.p99)}</td><td>${cell(c.max)}</td></tr>`;
  }

  // -- start ----------------------------------------------------------------------------
  keyFromUrl();
  login().then((ok) => { if (ok) route(); });
  setInterval(() => { if (!$("sessions-page").hidden && Api.key()) loadSessions(); }, 5000);
})();
