// kclasync dashboard: the charts over a window (uPlot, served with the package).
// Exposes window.kclasyncCharts = { render(samples, now, windowSeconds), colour(worker) }.
"use strict";

(function () {
  const PALETTE = ["#2563eb", "#d97706", "#059669", "#db2777", "#7c3aed", "#0891b2",
    "#65a30d", "#dc2626", "#4b5563", "#c026d3", "#0d9488", "#ea580c"];
  const known = new Map();

  function colour(worker) {
    if (!known.has(worker)) known.set(worker, PALETTE[known.size % PALETTE.length]);
    return known.get(worker);
  }

  // One chart per field; "fleet" charts sum a field over the workers (one series each).
  const CHARTS = [
    { id: "chart-rate", title: "records/s per worker", field: "records_per_second" },
    { id: "chart-behind", title: "max millis behind latest per worker", field: "max_millis_behind" },
    { id: "chart-leases", title: "leases per worker", field: "leases" },
    {
      id: "chart-failures", title: "renewal failures and processor errors (fleet, cumulative)",
      fleet: [["renewal failures", "renewal_failures", "#b45309"],
        ["processor errors", "processor_errors", "#b91c1c"]],
    },
  ];
  const plots = new Map();
  let view = { now: 0, seconds: 900 };

  function seriesOf(spec, workers) {
    if (spec.fleet) return spec.fleet.map(([label, field, stroke]) => ({ label, field, stroke }));
    return workers.map((w) => ({ label: w, worker: w, stroke: colour(w) }));
  }

  function value(sample, spec, series) {
    if (series.worker !== undefined) {
      const m = sample.workers[series.worker];
      const v = m ? m[spec.field] : null;
      return v === undefined ? null : v;
    }
    let total = null;
    for (const m of Object.values(sample.workers)) {
      const v = m[series.field];
      if (v !== null && v !== undefined) total = (total || 0) + v;
    }
    return total;
  }

  function make(spec, series, data, node) {
    const width = Math.max(320, node.clientWidth - 4);
    const opts = {
      title: spec.title, width: width, height: 170,
      scales: { x: { time: true, range: () => [view.now - view.seconds, view.now] },
        y: { range: (u, min, max) => [0, Math.max(1, max || 0) * 1.1] } },
      series: [{}].concat(series.map((s) => ({
        label: s.label, stroke: s.stroke, width: 2, spanGaps: false, points: { show: false },
      }))),
      axes: [{}, { size: 60 }],
      legend: { live: false },
    };
    return new uPlot(opts, data, node);
  }

  function render(samples, now, seconds) {
    view = { now: now, seconds: seconds };
    const inWindow = samples.filter((s) => s.t >= now - seconds && s.t <= now);
    const workers = [...new Set(inWindow.flatMap((s) => Object.keys(s.workers)))].sort();
    for (const spec of CHARTS) {
      const node = document.getElementById(spec.id);
      if (!node) continue;
      const series = seriesOf(spec, workers);
      const data = [inWindow.map((s) => s.t)].concat(
        series.map((se) => inWindow.map((s) => value(s, spec, se))));
      const key = series.map((s) => s.label).join("\u0000");
      const held = plots.get(spec.id);
      if (held && held.key === key) held.plot.setData(data);
      else {
        if (held) held.plot.destroy();
        node.replaceChildren();
        plots.set(spec.id, { key: key, plot: make(spec, series, data, node) });
      }
      // For tests and tools: the points drawn per series (non-null values in the window).
      const points = {};
      series.forEach((se, i) => { points[se.label] = data[i + 1].filter((v) => v !== null).length; });
      node.dataset.points = JSON.stringify(points);
    }
  }

  window.kclasyncCharts = { render: render, colour: colour };
})();
