// Small SVG charts for the stats page: stacked bars per minute, percentile lines per
// minute, horizontal bars. No library: the numbers come ready from /v1/stats.
"use strict";

const Charts = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const COLORS = {
    started: "#5b8def", completed: "#27ae60", cancelled: "#e67e22", failed: "#c0392b",
    timedOut: "#8e44ad", p50: "#27ae60", p90: "#f2a93b", p99: "#c0392b",
  };

  function el(name, attrs, parent) {
    const n = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs || {})) n.setAttribute(k, v);
    if (parent) parent.appendChild(n);
    return n;
  }

  function frame(svg) {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    const w = svg.clientWidth || 440, h = svg.clientHeight || 220;
    svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
    return { w, h, l: 44, r: 10, t: 18, b: 22 };
  }

  function empty(svg, f, text) {
    el("text", { x: f.w / 2 - 40, y: f.h / 2 }, svg).textContent = text || "no data yet";
  }

  function hhmm(ms) {
    const d = new Date(ms);
    return String(d.getHours()).padStart(2, "0") + ":" + String(d.getMinutes()).padStart(2, "0");
  }

  function axes(svg, f, max, minutes, unit) {
    for (let i = 0; i <= 4; i++) {
      const v = (max * i) / 4, y = f.h - f.b - ((f.h - f.t - f.b) * i) / 4;
      el("line", { x1: f.l, x2: f.w - f.r, y1: y, y2: y, stroke: "#eee" }, svg);
      el("text", { x: 2, y: y + 3 }, svg).textContent = (v >= 10 ? Math.round(v) : v.toFixed(1)) + (unit || "");
    }
    const n = minutes.length, every = Math.max(1, Math.ceil(n / 8));
    minutes.forEach((m, i) => {
      if (i % every) return;
      const x = f.l + ((i + 0.5) * (f.w - f.l - f.r)) / n;
      el("text", { x: x - 12, y: f.h - 6 }, svg).textContent = hhmm(m);
    });
  }

  function legend(svg, f, keys) {
    keys.forEach((k, i) => {
      el("rect", { x: f.l + i * 80, y: 2, width: 10, height: 10, fill: COLORS[k] || "#999" }, svg);
      el("text", { x: f.l + i * 80 + 14, y: 11 }, svg).textContent = k;
    });
  }

  // rows: [{minute, ...}] possibly several per minute (tenants): summed here
  function stacked(svg, rows, keys) {
    const f = frame(svg);
    const by = new Map();
    for (const r of rows) {
      const cur = by.get(r.minute) || {};
      for (const k of keys) cur[k] = (cur[k] || 0) + (r[k] || 0);
      by.set(r.minute, cur);
    }
    const minutes = [...by.keys()].sort((a, b) => a - b);
    if (!minutes.length) return empty(svg, f);
    const max = Math.max(1, ...minutes.map((m) => keys.reduce((s, k) => s + by.get(m)[k], 0)));
    axes(svg, f, max, minutes);
    legend(svg, f, keys);
    const bw = (f.w - f.l - f.r) / minutes.length;
    const sy = (v) => ((f.h - f.t - f.b) * v) / max;
    minutes.forEach((m, i) => {
      let y = f.h - f.b;
      for (const k of keys) {
        const v = by.get(m)[k];
        if (!v) continue;
        const r = el("rect", { x: f.l + i * bw + 2, y: y - sy(v), width: Math.max(2, bw - 4),
                               height: sy(v), fill: COLORS[k], "data-key": k }, svg);
        el("title", {}, r).textContent = `${hhmm(m)} ${k}: ${v}`;
        y -= sy(v);
      }
    });
  }

  function lines(svg, rows, keys) {
    const f = frame(svg);
    const pts = rows.filter((r) => r.count > 0).sort((a, b) => a.minute - b.minute);
    if (!pts.length) return empty(svg, f);
    const max = Math.max(1, ...pts.flatMap((r) => keys.map((k) => r[k] || 0)));
    axes(svg, f, max, pts.map((r) => r.minute), "");
    legend(svg, f, keys);
    const n = pts.length, xw = (f.w - f.l - f.r) / n;
    const px = (i) => f.l + (i + 0.5) * xw;
    const py = (v) => f.h - f.b - ((f.h - f.t - f.b) * v) / max;
    for (const k of keys) {
      const d = pts.map((r, i) => `${i ? "L" : "M"}${px(i)},${py(r[k] || 0)}`).join(" ");
      el("path", { d, fill: "none", stroke: COLORS[k], "stroke-width": 2 }, svg);
      pts.forEach((r, i) => {
        const c = el("circle", { cx: px(i), cy: py(r[k] || 0), r: 3, fill: COLORS[k] }, svg);
        el("title", {}, c).textContent = `${hhmm(r.minute)} ${k}: ${r[k]} ms (n=${r.count})`;
      });
    }
  }

  function hbars(svg, items) {
    const f = frame(svg);
    if (!items.length) return empty(svg, f, "no rejections");
    const max = Math.max(...items.map((i) => i[1]));
    const bh = Math.min(24, (f.h - 10) / items.length - 4);
    items.forEach(([label, v], i) => {
      const y = 6 + i * (bh + 4);
      el("text", { x: 2, y: y + bh - 5 }, svg).textContent = label;
      const w = ((f.w - 150) * v) / max;
      el("rect", { x: 140, y, width: Math.max(2, w), height: bh, fill: "#c0392b",
                   "data-key": label }, svg);
      el("text", { x: 144 + w, y: y + bh - 5 }, svg).textContent = String(v);
    });
  }

  return { stacked, lines, hbars };
})();
