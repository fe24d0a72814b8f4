// flowrl review: keys and buttons. No inline script anywhere (the page's CSP forbids it): this file is all.
(function () {
  "use strict";
  const page = document.body.dataset;
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  let busy = false;

  function say(text) {
    const el = document.getElementById("status");
    if (el) el.textContent = text;
  }

  function go(url) {
    if (url) window.location.assign(url);
  }

  async function post(url, body) {
    const response = await fetch(url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf },
      body: JSON.stringify(body),
    });
    const data = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(data.error || response.statusText);
    return data;
  }

  async function label(good) {
    if (busy || !page.traceId) return;
    busy = true;
    const notes = document.getElementById("notes");
    say("saving…");
    try {
      const data = await post("/api/label", {
        trace_id: page.traceId,
        label: good ? "good" : "bad",
        notes: notes ? notes.value : "",
      });
      document.getElementById("labelled-today").textContent = data.labelled_today;
      say("labelled " + data.label);
      go(page.next || page.queue);
    } catch (err) {
      say("not saved: " + err.message);
      busy = false;
    }
  }

  async function refit() {
    if (busy) return;
    busy = true;
    say("refitting the learned reward…");
    try {
      await post("/api/refit", {});
      window.location.reload();
    } catch (err) {
      say("refit failed: " + err.message);
      busy = false;
    }
  }

  async function pick() {
    const best = document.querySelector('input[name="best"]:checked');
    const worst = document.querySelector('input[name="worst"]:checked');
    if (!best || !worst) {
      say("pick a best and a worst run first");
      return;
    }
    try {
      await post("/api/pick", { group_id: page.groupId, best: best.value, worst: worst.value });
      say("saved: " + best.value + " good, " + worst.value + " bad");
    } catch (err) {
      say("not saved: " + err.message);
    }
  }

  function notes() {
    const el = document.getElementById("notes");
    if (el) el.focus();
  }

  const actions = {
    good: () => label(true),
    bad: () => label(false),
    skip: () => go(page.next || page.queue),
    next: () => go(page.next),
    prev: () => go(page.prev),
    notes: notes,
    refit: refit,
    pick: pick,
  };
  const keys = { g: "good", b: "bad", s: "skip", n: "next", p: "prev", e: "notes", r: "refit" };

  document.addEventListener("keydown", (event) => {
    const target = event.target;
    if (target instanceof HTMLElement && target.closest("input, textarea, select")) {
      if (event.key === "Escape") target.blur();
      return;
    }
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    const action = keys[event.key];
    if (!action) return;
    event.preventDefault();
    actions[action]();
  });

  document.querySelectorAll("[data-action]").forEach((button) => {
    button.addEventListener("click", () => actions[button.dataset.action]());
  });
})();
