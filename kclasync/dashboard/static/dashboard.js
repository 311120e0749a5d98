// kclasync dashboard: renders the documents the server sends over server-sent events.
// Builds the DOM with textContent only: names from the table are never parsed as HTML.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  let previousOwners = null;

  function el(tag, text, cls) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (cls) node.className = cls;
    return node;
  }

  function cell(row, text, cls, title) {
    const td = el("td", text, cls);
    if (title) td.title = title;
    row.appendChild(td);
    return td;
  }

  function none(text) { return el("span", text || "n/a", "none"); }

  function ago(seconds) {
    if (seconds === null || seconds === undefined) return null;
    if (seconds < 60) return seconds.toFixed(1) + " s ago";
    if (seconds < 3600) return Math.floor(seconds / 60) + " min ago";
    return (seconds / 3600).toFixed(1) + " h ago";
  }

  function num(value, digits) {
    if (value === null || value === undefined) return null;
    return Number(value).toLocaleString(undefined, { maximumFractionDigits: digits || 0 });
  }

  function shortText(text, width) {
    if (!text) return "";
    return text.length <= width ? text : "…" + text.slice(text.length - width + 1);
  }

  function clock(unixSeconds) {
    return new Date(unixSeconds * 1000).toLocaleTimeString();
  }

  function fill(td, value) {
    if (value === null || value === undefined) td.appendChild(none());
    else td.textContent = value;
  }

  function renderLeader(leader) {
    const pill = $("leader");
    if (!leader || leader.state === "none") {
      pill.textContent = "leader: none";
      pill.className = "pill warn";
      return;
    }
    pill.textContent = "leader: " + (leader.owner || "?") +
      (leader.state === "held" ? "" : " (" + leader.state + ")");
    pill.className = "pill " + (leader.state === "held" ? "on" : "warn");
  }

  function renderWorkers(doc) {
    const body = $("workers").tBodies[0];
    body.replaceChildren();
    for (const w of doc.workers) {
      const row = el("tr");
      row.dataset.worker = w.id;
      const name = cell(row, w.id, "mono");
      name.dataset.col = "id";
      if (w.leader) name.appendChild(el("span", "leader", "badge"));
      if (!w.registered) name.appendChild(el("span", "not registered", "badge gone"));
      const leases = cell(row, w.leases, "num");
      leases.dataset.col = "leases";
      const beat = cell(row, null);
      if (!w.registered) beat.appendChild(none());
      else if (doc.replay) beat.appendChild(none("not recorded"));
      else if (w.heartbeat_age === null) beat.textContent = "alive (first seen)";
      else {
        beat.textContent = ago(w.heartbeat_age);
        if (w.heartbeat_age > 10) beat.className = "stale";
      }
      const m = w.metrics;
      fill(cell(row, null, "num"), m ? num(m.records_per_second, 1) : null);
      fill(cell(row, null, "num"), m ? num(m.max_millis_behind) : null);
      fill(cell(row, null, "num"), m ? num(m.renewal_failures) : null);
      fill(cell(row, null, "num"), m ? num(m.processor_errors) : null);
      body.appendChild(row);
    }
    $("worker-count").textContent = "(" + doc.workers.length + ")";
    $("metrics-note").textContent = doc.metrics_sources
      ? "Metrics from " + doc.metrics_sources + " worker endpoint(s)."
      : "No metrics endpoints given (--metrics URL): lag and rates are n/a.";
  }

  function lineage(lease) {
    const parts = [];
    if (lease.parents.length) parts.push(lease.parents.join(", ") + " →");
    parts.push("●");
    if (lease.children.length) parts.push("→ " + lease.children.join(", "));
    return parts.length > 1 ? parts.join(" ") : null;
  }

  function renderLeases(doc) {
    const body = $("leases").tBodies[0];
    body.replaceChildren();
    for (const l of doc.leases) {
      const row = el("tr");
      row.dataset.lease = l.key;
      if (previousOwners && previousOwners.get(l.key) !== l.owner) row.className = "changed";
      const key = cell(row, l.key, "mono");
      if (l.finished) key.appendChild(el("span", "finished", "badge done"));
      const owner = cell(row, null, "mono");
      owner.dataset.col = "owner";
      fill(owner, l.owner);
      cell(row, l.counter, "num");
      const renewed = cell(row, null);
      fill(renewed, ago(l.renewal_age));
      if (l.renewal_age !== null && l.renewal_age > 10 && l.owner) renewed.className = "stale";
      const cp = cell(row, shortText(l.checkpoint, 24), "mono", l.checkpoint);
      if (l.pending_checkpoint) cp.appendChild(el("span", "pending", "badge"));
      const lag = cell(row, null);
      lag.dataset.col = "lag";
      if (l.millis_behind_latest !== null) lag.textContent = num(l.millis_behind_latest) + " ms behind";
      else if (l.checkpoint_age !== null) lag.textContent = "checkpoint " + ago(l.checkpoint_age);
      else lag.appendChild(none());
      fill(cell(row, null, "num"), num(l.records_per_second, 1));
      fill(cell(row, null, "num"), num(l.throughput_kbps, 1));
      const sticky = cell(row, null);
      if (l.sticky === null) sticky.appendChild(none("normal"));
      else sticky.textContent = (l.sticky_mode || "unknown") + " (" + l.sticky + ")" +
        (l.sticky_worker ? " → " + l.sticky_worker : "");
      const lin = cell(row, null, "mono");
      const line = lineage(l);
      if (line === null) lin.appendChild(none("—"));
      else lin.textContent = line;
      body.appendChild(row);
    }
    $("lease-count").textContent = "(" + doc.leases.length + ")";
    previousOwners = new Map(doc.leases.map((l) => [l.key, l.owner]));
    const corrupt = $("corrupt");
    corrupt.replaceChildren(...doc.corrupt.map((c) => el("li", "unreadable item: " + c)));
  }

  function renderChanges(doc) {
    const list = $("changes");
    list.replaceChildren();
    if (!doc.changes.length) list.appendChild(el("li", "none since this page's server started", "none"));
    for (const c of doc.changes) {
      const item = el("li");
      item.dataset.lease = c.lease;
      item.appendChild(el("time", clock(c.at)));
      item.appendChild(el("span", c.lease + ": ", "mono"));
      item.appendChild(el("span", (c.from || "(nobody)") + " → " + (c.to || "(nobody)"), "mono"));
      list.appendChild(item);
    }
  }

  // The past, as the dashboard's process remembers it (loaded once, then kept up to date).
  const MAX_WINDOW = 6 * 3600;
  let samples = [];
  let timeline = {};
  let lastDoc = null;

  function windowSeconds() { return Number($("window").value); }

  function absorb(doc) {
    if (doc.sample && (!samples.length || doc.sample.t > samples[samples.length - 1].t)) {
      samples.push(doc.sample);
      while (samples.length && samples[0].t < doc.sample.t - MAX_WINDOW) samples.shift();
    }
    for (const [key, changed] of Object.entries(doc.timeline_update || {})) {
      const segs = timeline[key] || (timeline[key] = []);
      for (const seg of changed) {
        const at = segs.findIndex((s) => s.start === seg.start);
        if (at >= 0) segs[at] = seg;
        else segs.push(seg);
      }
    }
  }

  // A recording is shown whole at first (a demo's is a minute, a simulation's hours).
  function wholeRecording(replay) {
    const select = $("window");
    if (select.querySelector("option[data-whole]") || replay.start === null) return;
    const option = el("option", "the whole recording");
    option.value = String(Math.max(10, Math.ceil((replay.end - replay.start) * 1.02)));
    option.dataset.whole = "1";
    select.appendChild(option);
    select.value = option.value;
  }

  function renderHistory() {
    if (!lastDoc) return;
    const seconds = windowSeconds();
    try {
      window.kclasyncCharts.render(samples, lastDoc.at, seconds);
    } catch (err) {
      $("charts-note").textContent = "charts unavailable: " + err;
    }
    window.kclasyncTimeline.render(timeline, lastDoc.at, seconds);
    $("timeline-count").textContent = "(" + Object.keys(timeline).length + " leases)";
  }

  function render(doc) {
    lastDoc = doc;
    absorb(doc);
    $("application").textContent = doc.application;
    document.title = "kclasync · " + doc.application;
    if (doc.replay) {
      $("leader").textContent = "leader: not recorded";
      $("leader").className = "pill";
    } else renderLeader(doc.leader);
    renderWorkers(doc);
    renderLeases(doc);
    renderChanges(doc);
    const errors = $("errors");
    errors.hidden = !doc.errors.length;
    errors.replaceChildren(...doc.errors.map((e) => el("div", e)));
    $("updated").textContent = (doc.replay ? "recording ends " : "updated ") + clock(doc.at);
    if (doc.replay) {
      $("connection").textContent = "replay (" + (doc.replay.source || "recording") + ")";
      $("connection").className = "pill warn";
      wholeRecording(doc.replay);
    }
    renderHistory();
    document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
  }

  async function loadHistory() {
    try {
      const answer = await fetch("history.json", { cache: "no-store" });
      const past = await answer.json();
      samples = past.samples;
      timeline = past.timeline;
    } catch (err) {
      samples = [];
      timeline = {};
    }
  }

  $("window").addEventListener("change", renderHistory);
  window.addEventListener("resize", renderHistory);

  let broken = false;
  loadHistory().then(() => {
    const source = new EventSource("events");
    source.addEventListener("snapshot", (event) => {
      $("connection").textContent = "live";
      $("connection").className = "pill on";
      render(JSON.parse(event.data));
    });
    source.onopen = () => {
      if (broken) loadHistory().then(renderHistory);  // the server may have restarted
      broken = false;
    };
    source.onerror = () => {
      broken = true;
      $("connection").textContent = "reconnecting";
      $("connection").className = "pill off";
    };
  });
})();
