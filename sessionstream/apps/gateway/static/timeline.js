// A run's timeline as SVG swimlanes: model requests, tools, sub-tasks and actions as bars
// (started -> finished, matched by callId / idempotencyKey), marks for steers, follow-ups,
// cancels, lease changes and generation changes, and the terminal status at the end. Built
// from the run's events only (the seed's JSON form), so a replay from PostgreSQL and the
// live stream draw the same picture.
"use strict";

const Timeline = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const LANES = [
    ["control", "control"], ["model", "model"], ["tool", "tools"],
    ["subtask", "sub-tasks"], ["action", "actions"],
  ];
  const BAR_KIND = {
    "model.request.started": "model", "model.request.finished": "model",
    "tool.started": "tool", "tool.finished": "tool",
    "subtask.started": "subtask", "subtask.finished": "subtask",
  };
  const MARKS = {
    "run.steered": ["steer", "#1d6fd6"],
    "run.follow_up_queued": ["follow-up", "#16a085"],
    "run.round_completed": ["round completed", "#16a085"],
    "run.follow_up_delivered": ["follow-up delivered", "#16a085"],
    "run.input_delivered": ["input delivered", "#16a085"],
    "run.input_consumed": ["input consumed", "#16a085"],
    "run.input_dropped": ["input dropped", "#7f8c8d"],
    "run.cancel_requested": ["cancel", "#c0392b"],
    "run.cancel_acknowledged": ["cancel ack", "#c0392b"],
    "run.lease_granted": ["lease", "#34495e"],
    "run.lease_released": ["lease released", "#7f8c8d"],
    "run.lease_expired": ["lease expired", "#d35400"],
    "run.compaction_started": ["compacting", "#8e44ad"],
    "run.compaction_finished": ["compacted", "#8e44ad"],
    "run.compaction_abandoned": ["compaction abandoned", "#8e44ad"],
    "run.stale_write_recorded": ["stale write", "#d35400"],
  };

  // events of one run -> {start, end, finished, bars, marks, status, generation}
  function model(events, now) {
    const evs = events.slice().sort((a, b) => a.seq - b.seq);
    const start = evs.length ? evs[0].ts : now;
    const fin = evs.find((e) => e.type === "run.finished");
    const end = fin ? fin.ts : Math.max(now, evs.length ? evs[evs.length - 1].ts : now);
    const open = new Map();
    const bars = [];
    const marks = [];
    let status = evs.length ? "running" : "idle";
    let generation = null;
    for (const e of evs) {
      const p = e.payload || {};
      if (generation !== null && e.generation !== generation && e.generation > 0) {
        marks.push({ ts: e.ts, type: "generation", label: "gen " + e.generation, color: "#d35400" });
      }
      if (e.generation > 0) generation = e.generation;
      const kind = BAR_KIND[e.type];
      if (kind) {
        const id = kind + "/" + (p.callId || p.name || e.seq);
        if (e.type.endsWith(".started")) {
          const bar = { lane: kind, id, name: p.name || kind, detail: p.detail, from: e.ts,
                        to: null, seq: e.seq };
          open.set(id, bar);
          bars.push(bar);
        } else if (open.has(id)) {
          open.get(id).to = e.ts;
          open.delete(id);
        }
      } else if (e.type === "action.approved") {
        const bar = { lane: "action", id: "action/" + p.idempotencyKey, name: p.kind || "action",
                      detail: p.idempotencyKey, from: e.ts, to: null, seq: e.seq };
        open.set(bar.id, bar);
        bars.push(bar);
      } else if (e.type === "action.completed") {
        const bar = open.get("action/" + p.idempotencyKey);
        if (bar) { bar.to = e.ts; open.delete(bar.id); }
      } else if (e.type === "action.denied") {
        marks.push({ ts: e.ts, type: e.type, lane: "action", label: "denied " + (p.kind || ""),
                     color: "#c0392b" });
      } else if (MARKS[e.type]) {
        let label = MARKS[e.type][0];
        if (e.type === "run.lease_granted" && p.workerId) label = "lease " + p.workerId;
        marks.push({ ts: e.ts, type: e.type, label, color: MARKS[e.type][1] });
      }
      if (e.type === "run.cancel_requested") status = "cancelling";
      if (e.type === "run.compaction_started") status = "compacting";
      if (e.type === "run.compaction_finished" || e.type === "run.compaction_abandoned") status = "running";
      if (e.type === "run.finished") status = p.terminalStatus;
    }
    for (const bar of bars) {
      if (bar.to === null) {
        bar.to = end;
        if (fin) bar.aborted = true; else bar.open = true;
      }
    }
    return { start, end, fin, bars, marks, status, generation };
  }

  function el(name, attrs, parent) {
    const n = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs || {})) n.setAttribute(k, v);
    if (parent) parent.appendChild(n);
    return n;
  }

  // greedy rows inside a lane, so overlapping bars stay visible
  function pack(bars) {
    const rows = [];
    for (const b of bars.sort((a, c) => a.from - c.from)) {
      let r = rows.findIndex((last) => last <= b.from);
      if (r < 0) { r = rows.length; rows.push(0); }
      rows[r] = b.to;
      b.row = r;
    }
    return Math.max(1, rows.length);
  }

  function render(svg, events, now) {
    const m = model(events, now);
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    const width = Math.max(700, svg.clientWidth || svg.parentNode.clientWidth || 900);
    const left = 80, right = 110, rowH = 16, pad = 8;
    const span = Math.max(1000, m.end - m.start);
    const x = (t) => left + ((t - m.start) / span) * (width - left - right);
    let y = 6;
    const laneY = {};
    for (const [lane, label] of LANES) {
      // control: a row for the terminal status, two alternating rows of marks
      const rows = lane === "control" ? 3 : pack(m.bars.filter((b) => b.lane === lane));
      const h = rows * (rowH + 2) + pad;
      laneY[lane] = y;
      el("rect", { x: 0, y, width, height: h, fill: lane === "control" ? "#fafbfc" : "#fff" }, svg);
      el("line", { x1: 0, x2: width, y1: y + h, y2: y + h, stroke: "#eceff3" }, svg);
      el("text", { x: 6, y: y + 14, class: "lane-label" }, svg).textContent = label;
      y += h;
    }
    const axisY = y + 4;
    svg.setAttribute("height", axisY + 22);
    svg.setAttribute("viewBox", `0 0 ${width} ${axisY + 22}`);
    const step = niceStep(span / 8);
    for (let t = 0; t <= span; t += step) {
      el("line", { x1: x(m.start + t), x2: x(m.start + t), y1: 6, y2: axisY, stroke: "#f0f2f5" }, svg);
      el("text", { x: x(m.start + t) - 8, y: axisY + 14 }, svg).textContent = fmt(t);
    }
    for (const b of m.bars) {
      const by = laneY[b.lane] + 4 + b.row * (rowH + 2);
      const g = el("g", {}, svg);
      const rect = el("rect", {
        x: x(b.from), y: by, height: rowH, rx: 3,
        width: Math.max(3, x(b.to) - x(b.from)),
        class: "bar " + b.lane + (b.open ? " open" : "") + (b.aborted ? " aborted" : ""),
        "data-lane": b.lane, "data-name": b.name, "data-state": b.open ? "open" : (b.aborted ? "aborted" : "done"),
      }, g);
      el("title", {}, rect).textContent = `${b.name} ${b.detail || ""} ${fmt(b.to - b.from)}`;
      if (x(b.to) - x(b.from) > 40) {
        el("text", { x: x(b.from) + 4, y: by + 12, fill: "#fff" }, g).textContent = b.name;
      }
    }
    let alt = 0;
    for (const mk of m.marks) {
      const lane = mk.lane || "control";
      const my = laneY[lane] + 3 + (lane === "control" ? (1 + (alt++ % 2)) * (rowH + 2) : 0);
      const g = el("g", { class: "mark", "data-type": mk.type }, svg);
      el("line", { x1: x(mk.ts), x2: x(mk.ts), y1: my, y2: my + rowH, stroke: mk.color }, g);
      el("circle", { cx: x(mk.ts), cy: my + 3, r: 3, fill: mk.color }, g);
      el("text", { x: x(mk.ts) + 4, y: my + 12, fill: mk.color }, g).textContent = mk.label;
    }
    if (m.fin) {
      const status = (m.fin.payload || {}).terminalStatus;
      const g = el("g", { class: "terminal", "data-status": status }, svg);
      el("line", { x1: x(m.fin.ts), x2: x(m.fin.ts), y1: 4, y2: axisY }, g);
      el("text", { x: x(m.fin.ts) + 5, y: laneY.control + 15, "font-weight": 700 }, g).textContent = status;
    }
    return m;
  }

  function niceStep(raw) {
    const steps = [100, 200, 500, 1000, 2000, 5000, 10000, 15000, 30000, 60000, 120000, 300000, 600000];
    return steps.find((s) => s >= raw) || 600000;
  }

  function fmt(ms) {
    return ms < 1000 ? Math.round(ms) + " ms" : ms < 60000 ? (ms / 1000).toFixed(1) + " s"
      : (ms / 60000).toFixed(1) + " min";
  }

  return { model, render, fmt };
})();
