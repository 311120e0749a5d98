// kclasync dashboard: the lease-ownership timeline, drawn as plain SVG.
// One row per lease, one bar per owner and state; marks where a lease was handed over, taken
// after its owner's expiry, or ended (SHARD_END). Hovering a bar shows owner, start, end, reason.
// Exposes window.kclasyncTimeline = { render(timeline, now, windowSeconds) }.
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const ROW = 22, BAR = 14, LABEL = 180, AXIS = 24;

  function svg(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    return node;
  }

  function clock(t) { return new Date(t * 1000).toLocaleTimeString(); }

  function tooltip() {
    let tip = document.getElementById("timeline-tip");
    if (!tip) {
      tip = document.createElement("div");
      tip.id = "timeline-tip";
      tip.hidden = true;
      document.body.appendChild(tip);
    }
    return tip;
  }

  function describe(lease, seg) {
    const lines = [
      ["lease", lease],
      ["owner", seg.owner || "(nobody)"],
      ["start", clock(seg.start)],
      ["end", seg.end === null ? "(holds it now)" : clock(seg.end)],
      ["reason", seg.reason],
    ];
    if (seg.state !== "normal") lines.push(["state", seg.state]);
    if (seg.ended_by) lines.push(["ended by", seg.ended_by]);
    return lines;
  }

  function showTip(event, lease, seg) {
    const tip = tooltip();
    tip.replaceChildren(...describe(lease, seg).map(([k, v]) => {
      const row = document.createElement("div");
      const name = document.createElement("b");
      name.textContent = k + ": ";
      row.appendChild(name);
      row.appendChild(document.createTextNode(v));
      return row;
    }));
    tip.hidden = false;
    tip.style.left = (event.pageX + 12) + "px";
    tip.style.top = (event.pageY + 12) + "px";
  }

  function mark(group, x, y, reason) {
    if (reason === "taken after expiry") {
      group.appendChild(svg("path", {
        d: `M${x - 4} ${y - 4} L${x + 4} ${y + 4} M${x + 4} ${y - 4} L${x - 4} ${y + 4}`,
        class: "mark expiry",
      }));
    } else if (reason === "handed over") {
      group.appendChild(svg("path", { d: `M${x} ${y - 6} L${x + 5} ${y} L${x} ${y + 6} Z`, class: "mark handoff" }));
    } else if (reason === "shard end") {
      group.appendChild(svg("rect", { x: x - 1.5, y: y - 7, width: 3, height: 14, class: "mark shard-end" }));
    }
  }

  function render(timeline, now, seconds) {
    const host = document.getElementById("timeline");
    const keys = Object.keys(timeline).sort();
    const width = Math.max(480, host.clientWidth);
    const height = keys.length * ROW + AXIS;
    const t0 = now - seconds;
    const span = width - LABEL - 8;
    const xOf = (t) => LABEL + ((Math.min(Math.max(t, t0), now) - t0) / seconds) * span;
    const root = svg("svg", { width: width, height: height, role: "img" });
    keys.forEach((key, i) => {
      const y = i * ROW;
      const row = svg("g", { "data-lease": key, class: "lease-row" });
      const label = svg("text", { x: 4, y: y + ROW / 2 + 4, class: "lease-label" });
      label.textContent = key;
      row.appendChild(label);
      row.appendChild(svg("line", { x1: LABEL, x2: LABEL + span, y1: y + ROW / 2, y2: y + ROW / 2, class: "lane" }));
      for (const seg of timeline[key]) {
        const end = seg.end === null ? now : seg.end;
        if (end < t0 || seg.start > now) continue;
        const x1 = xOf(seg.start), x2 = xOf(end);
        if (seg.owner !== null) {
          const bar = svg("rect", {
            x: x1, y: y + (ROW - BAR) / 2, width: Math.max(1, x2 - x1), height: BAR, rx: 2,
            fill: window.kclasyncCharts.colour(seg.owner),
            class: "bar state-" + seg.state,
            "data-owner": seg.owner, "data-reason": seg.reason, "data-state": seg.state,
            "data-start": seg.start, "data-end": seg.end === null ? "" : seg.end,
          });
          bar.addEventListener("mousemove", (e) => showTip(e, key, seg));
          bar.addEventListener("mouseleave", () => { tooltip().hidden = true; });
          row.appendChild(bar);
        } else if (seg.state === "shard_end") {
          row.appendChild(svg("rect", {
            x: x1, y: y + (ROW - BAR) / 2, width: Math.max(1, x2 - x1), height: BAR,
            class: "bar ended", "data-state": seg.state, "data-reason": seg.reason,
          }));
        }
        if (seg.start >= t0) mark(row, x1, y + ROW / 2, seg.reason);
      }
      root.appendChild(row);
    });
    const axis = svg("g", { class: "axis" });
    for (let k = 0; k <= 5; k++) {
      const t = t0 + (seconds * k) / 5, x = xOf(t);
      axis.appendChild(svg("line", { x1: x, x2: x, y1: 0, y2: height - AXIS + 4, class: "tick" }));
      const text = svg("text", { x: x, y: height - 6, "text-anchor": k === 0 ? "start" : k === 5 ? "end" : "middle" });
      text.textContent = clock(t);
      axis.appendChild(text);
    }
    root.insertBefore(axis, root.firstChild);
    host.replaceChildren(root);
    renderLegend(timeline);
  }

  function renderLegend(timeline) {
    const legend = document.getElementById("timeline-legend");
    const owners = new Set();
    for (const segs of Object.values(timeline)) for (const s of segs) if (s.owner) owners.add(s.owner);
    const items = [...owners].sort().map((w) => {
      const item = document.createElement("span");
      item.className = "swatch";
      item.style.setProperty("--swatch", window.kclasyncCharts.colour(w));
      item.textContent = w;
      return item;
    });
    for (const [cls, text] of [["handoff", "handed over"], ["expiry", "taken after expiry"],
      ["shard-end", "SHARD_END"], ["pinned", "sticky (pinned / release)"]]) {
      const item = document.createElement("span");
      item.className = "key key-" + cls;
      item.textContent = text;
      items.push(item);
    }
    legend.replaceChildren(...items);
  }

  window.kclasyncTimeline = { render: render };
})();
