// Questions to a person in the console (ctx.ask_user): each question of the run the
// timeline shows — open ones with the question, the time left, a text box and Answer;
// answered ones with the answer and who gave it; closed ones with why. Built from the run's
// events (question.asked / answered / closed); the list is rebuilt only when those change
// (what a person is typing stays put while the time left counts down).
"use strict";

const Questions = (() => {
  // questionId -> {id, question, schema, expiresAt, generation, status, answer, by, reason}
  function of(evs) {
    const out = new Map();
    for (const e of evs.slice().sort((a, b) => a.seq - b.seq)) {
      const p = e.payload || {};
      if (e.type === "question.asked") {
        out.set(p.questionId, { id: p.questionId, question: p.question, schema: p.schema || null,
          expiresAt: p.expiresAt, generation: e.generation, status: "open", answer: null,
          by: null, reason: null });
      } else if (e.type === "question.answered" && out.has(p.questionId)) {
        Object.assign(out.get(p.questionId), { status: "answered", answer: p.answer, by: p.answeredBy || null });
      } else if (e.type === "question.closed" && out.has(p.questionId)) {
        Object.assign(out.get(p.questionId), { status: "closed", reason: p.reason });
      }
    }
    return [...out.values()];
  }

  function left(ms) {
    if (ms <= 0) return "expired";
    const s = Math.floor(ms / 1000);
    return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s left`;
  }

  // What the box holds, as the answer: a JSON value when it reads as one ("3", "true",
  // "\"x\"", "{...}"), else the words as a string.
  function value(text) {
    try { return JSON.parse(text); } catch (_) { return text; }
  }

  // Draws into `ul`; onAnswer(question, value) sends the answer.
  function render(ul, evs, now, onAnswer) {
    const items = of(evs);
    const sig = JSON.stringify(items);
    if (ul.dataset.sig !== sig) {
      ul.dataset.sig = sig;
      ul.textContent = "";
      for (const q of items) {
        const li = document.createElement("li");
        li.className = "question";
        li.dataset.id = q.id;
        li.dataset.status = q.status;
        const what = document.createElement("span");
        what.className = "what";
        what.textContent = q.question;
        li.append(what, " ");
        if (q.status === "open") {
          const t = document.createElement("span");
          t.className = "left muted";
          const form = document.createElement("form");
          const box = document.createElement("input");
          box.type = "text";
          box.className = "answer-box";
          box.placeholder = q.schema ? `answer (${q.schema})` : "answer (JSON or words)";
          box.setAttribute("aria-label", `answer to ${q.question}`);
          const send = document.createElement("button");
          send.type = "submit";
          send.className = "answer";
          send.textContent = "Answer";
          form.append(box, " ", send);
          form.addEventListener("submit", (ev) => {
            ev.preventDefault();
            if (!box.value.trim()) return;
            box.disabled = send.disabled = true;
            onAnswer(q, value(box.value.trim()));
          });
          li.append(t, " ", form);
        } else {
          const how = document.createElement("span");
          how.className = "decided";
          how.textContent = q.status === "answered"
            ? `answered by ${q.by || "?"}: ${q.answer}`
            : `closed (${q.reason})`;
          li.append(how);
        }
        ul.appendChild(li);
      }
    }
    for (const li of ul.querySelectorAll("li[data-status=open]")) {
      const q = items.find((x) => x.id === li.dataset.id);
      if (q) li.querySelector(".left").textContent = left(q.expiresAt - now);
    }
    ul.hidden = items.length === 0;
    return items.some((q) => q.status === "open");
  }

  return { of, render };
})();
