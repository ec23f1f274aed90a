// The action gate in the console: each key of the run the timeline shows that needed a
// person — pending ones with their kind, the digest of their arguments, the time left and
// Approve / Deny; decided ones with who decided. Built from the run's events
// (action.pending / approved / denied / completed); the list is rebuilt only when those
// change (the buttons stay put while the time left counts down).
"use strict";

const Approvals = (() => {
  // key -> {key, kind, digest, expiresAt, generation, decision, by, reason, detail, done}
  function of(evs) {
    const out = new Map();
    for (const e of evs.slice().sort((a, b) => a.seq - b.seq)) {
      const p = e.payload || {};
      if (e.type === "action.pending") {
        out.set(p.idempotencyKey, { key: p.idempotencyKey, kind: p.kind, digest: p.argsDigest,
          expiresAt: p.expiresAt, generation: e.generation, decision: "pending", by: null,
          reason: null, detail: p.detail, done: false });
      } else if ((e.type === "action.approved" || e.type === "action.denied") && out.has(p.idempotencyKey)) {
        const a = out.get(p.idempotencyKey);
        a.decision = e.type === "action.approved" ? "approved" : "denied";
        a.by = p.decidedBy || null;
        a.reason = p.reason || null;
        if (p.detail) a.detail = p.detail;
      } else if (e.type === "action.completed" && out.has(p.idempotencyKey)) {
        out.get(p.idempotencyKey).done = true;
      }
    }
    return [...out.values()];
  }

  function left(ms) {
    if (ms <= 0) return "expired";
    const s = Math.floor(ms / 1000);
    return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s left`;
  }

  // Draws into `ul`; onDecide(action, "approve" | "deny") sends the decision.
  function render(ul, evs, now, onDecide) {
    const items = of(evs);
    const sig = JSON.stringify(items);
    if (ul.dataset.sig !== sig) {
      ul.dataset.sig = sig;
      ul.textContent = "";
      for (const a of items) {
        const li = document.createElement("li");
        li.className = "approval";
        li.dataset.key = a.key;
        li.dataset.decision = a.decision;
        const what = document.createElement("span");
        what.className = "what";
        what.textContent = `${a.kind} · ${a.key}` + (a.detail && a.decision === "pending" ? ` · ${a.detail}` : "");
        const digest = document.createElement("code");
        digest.className = "digest";
        digest.title = a.digest || "no arguments";
        digest.textContent = a.digest ? a.digest.slice(0, 19) + "…" : "no arguments";
        li.append(what, " ", digest, " ");
        if (a.decision === "pending") {
          const t = document.createElement("span");
          t.className = "left muted";
          const approve = document.createElement("button");
          approve.type = "button";
          approve.className = "approve";
          approve.textContent = "Approve";
          const deny = document.createElement("button");
          deny.type = "button";
          deny.className = "deny danger";
          deny.textContent = "Deny";
          approve.addEventListener("click", () => { approve.disabled = deny.disabled = true; onDecide(a, "approve"); });
          deny.addEventListener("click", () => { approve.disabled = deny.disabled = true; onDecide(a, "deny"); });
          li.append(t, " ", approve, " ", deny);
        } else {
          const who = document.createElement("span");
          who.className = "decided";
          const by = a.by ? ` by ${a.by}` : ` (${a.reason || "the gate"})`;
          const why = a.decision === "denied" && a.by && a.detail ? `: ${a.detail}` : "";
          who.textContent = a.decision + by + why + (a.done ? " · executed" : "");
          li.append(who);
        }
        ul.appendChild(li);
      }
    }
    for (const li of ul.querySelectorAll("li[data-decision=pending]")) {
      const a = items.find((x) => x.key === li.dataset.key);
      if (a) li.querySelector(".left").textContent = left(a.expiresAt - now);
    }
    ul.hidden = items.length === 0;
    return items.some((a) => a.decision === "pending");
  }

  return { of, render };
})();
