// The gateway's HTTP API for the console: JSON calls and a Server-Sent-Events reader built
// on fetch, so the API key travels in the Authorization header (EventSource cannot set
// headers) and a reconnect resumes with Last-Event-ID.
"use strict";

const Api = (() => {
  const KEY = "sessionstream.apiKey";

  function key() { return localStorage.getItem(KEY); }
  function setKey(k) { k ? localStorage.setItem(KEY, k) : localStorage.removeItem(KEY); }

  async function call(method, path, body) {
    const headers = { "Authorization": "Bearer " + key() };
    const init = { method, headers };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const r = await fetch(path, init);
    let data = null;
    try { data = await r.json(); } catch (e) { data = null; }
    return { status: r.status, data };
  }

  // Calls onEvent({id, event, data}) for each event of the session, from after `lastId`
  // (null: from now on), reconnecting with the last id it saw. Returns a stop function.
  function streamSession(sessionId, lastId, onEvent, onState) {
    let stopped = false;
    let controller = null;
    let last = lastId;

    async function once() {
      controller = new AbortController();
      const headers = { "Authorization": "Bearer " + key(), "Accept": "text/event-stream" };
      if (last !== null && last !== undefined) headers["Last-Event-ID"] = String(last);
      const r = await fetch(`/v1/sessions/${encodeURIComponent(sessionId)}/events`,
        { headers, signal: controller.signal });
      if (r.status !== 200) throw new Error("events: HTTP " + r.status);
      onState(true);
      const reader = r.body.getReader();
      const decoder = new TextDecoder();
      let buf = "";
      let ev = { id: null, event: null, data: [] };
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true });
        let nl;
        while ((nl = buf.indexOf("\n")) >= 0) {
          let line = buf.slice(0, nl);
          buf = buf.slice(nl + 1);
          if (line.endsWith("\r")) line = line.slice(0, -1);
          if (line === "") {
            if (ev.data.length) {
              if (ev.id !== null) last = Number(ev.id);
              if (ev.event !== "overflow") {
                onEvent({ id: ev.id === null ? null : Number(ev.id), event: ev.event,
                          data: JSON.parse(ev.data.join("\n")) });
              }
            }
            ev = { id: null, event: null, data: [] };
          } else if (!line.startsWith(":")) {
            const i = line.indexOf(":");
            const name = i < 0 ? line : line.slice(0, i);
            let val = i < 0 ? "" : line.slice(i + 1);
            if (val.startsWith(" ")) val = val.slice(1);
            if (name === "id") ev.id = val;
            else if (name === "event") ev.event = val;
            else if (name === "data") ev.data.push(val);
          }
        }
      }
    }

    (async () => {
      while (!stopped) {
        try { await once(); } catch (e) { /* reconnect below */ }
        onState(false);
        if (!stopped) await new Promise((res) => setTimeout(res, 1000));
      }
    })();
    return () => { stopped = true; if (controller) controller.abort(); };
  }

  return { key, setKey, call, streamSession };
})();
