// gpufleet charts: every element with a data-chart attribute (the URL of a Chart JSON:
// {"title", "unit", "t": [unix s], "series": [{"label", "values": [number|null]}]}) becomes a uPlot
// chart. Drawn on load and after htmx swaps in new elements, fetched again every minute, as wide as
// its element. Times are shown in UTC, like every time on the dashboard.
//
// A chart that cannot be fetched says so inside its element, quietly: nothing is written to the
// console (the browser itself still reports a failed request).
"use strict";

(() => {
  const REFRESH_MS = 60_000;
  const HEIGHT = 220;
  const COLORS = ["#0969da", "#1a7f37", "#cf222e", "#9a6700", "#8250df", "#bf3989", "#1b7c83", "#6e7781"];
  const charts = new Map(); // element -> its state: {plot, key, timer, observer}

  const colorOf = (i) => COLORS[i % COLORS.length];
  const utc = (ts) => uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC");
  const pad = (n) => String(n).padStart(2, "0");
  const day = (d) => `${d.getUTCFullYear()}-${pad(d.getUTCMonth() + 1)}-${pad(d.getUTCDate())}`;
  const clock = (d, seconds) =>
    `${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}` + (seconds ? `:${pad(d.getUTCSeconds())}` : "");

  // Time ticks as 24-hour UTC, with the date under the first tick of each day; with seconds when
  // ticks are less than a minute apart (a young chart), so no two ticks read the same.
  function timeTicks(_u, splits, _axis, _space, increment) {
    const seconds = increment < 60;
    return splits.map((ts, i) => {
      const d = new Date(ts * 1e3);
      const newDay = i === 0 || day(new Date(splits[i - 1] * 1e3)) !== day(d);
      return newDay ? `${clock(d, seconds)}\n${day(d).slice(5)}` : clock(d, seconds);
    });
  }
  // Axis numbers short enough for the axis: 400000 W reads 400k.
  function compact(value) {
    const size = Math.abs(value);
    if (size >= 1e6) return `${+(value / 1e6).toFixed(1)}M`;
    if (size >= 1e4) return `${+(value / 1e3).toFixed(1)}k`;
    return `${+value.toFixed(2)}`;
  }
  const label = (element) => element.getAttribute("aria-label") || "Chart";

  function format(value, unit) {
    if (value == null || !Number.isFinite(value)) return "–";
    const digits = Math.abs(value) >= 100 ? 0 : 1;
    return `${value.toFixed(digits)} ${unit}`;
  }

  // A short muted line in place of the chart (no data yet, or why it could not be drawn).
  function say(element, state, text) {
    if (state.plot) {
      state.plot.destroy();
      state.plot = null;
      state.key = null;
    }
    let line = element.querySelector(":scope > .chart-message");
    if (!line) {
      element.replaceChildren();
      line = document.createElement("p");
      line.className = "chart-message muted";
      element.append(line);
    }
    line.textContent = text;
  }

  function hasPoints(chart) {
    return chart.t.length > 0 && chart.series.some((s) => s.values.some((v) => v != null));
  }

  function options(chart, width) {
    const unit = chart.unit;
    return {
      title: chart.title,
      width,
      height: HEIGHT,
      tzDate: utc,
      // Percentages on 0-100; the rest from 0 (or below, should a value be negative) to a little over the top.
      scales: { y: { range: unit === "%" ? [0, 100] : (_u, min, max) => [Math.min(0, min ?? 0), (max ?? 0) > 0 ? max * 1.1 : 1] } },
      axes: [
        { label: "UTC", labelSize: 18, values: timeTicks },
        { label: unit, labelSize: 18, size: 56, values: (_u, splits) => splits.map(compact) },
      ],
      series: [
        { label: "Time (UTC)", value: (_u, ts) => (ts == null ? "–" : `${day(new Date(ts * 1e3))} ${clock(new Date(ts * 1e3))}`) },
        ...chart.series.map((s, i) => ({
          label: s.label,
          stroke: colorOf(i),
          width: 1.5,
          points: { show: false },
          value: (_u, v) => format(v, unit),
        })),
      ],
      legend: { live: true },
      cursor: { drag: { x: false, y: false } },
    };
  }

  function widthOf(element) {
    const style = getComputedStyle(element);
    const padding = parseFloat(style.paddingLeft) + parseFloat(style.paddingRight);
    return Math.max(200, Math.floor(element.clientWidth - padding));
  }

  async function fetchChart(url) {
    let answer;
    try {
      answer = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    } catch (_) {
      return { error: "could not reach the head node" };
    }
    if (answer.status === 401) return { error: "not logged in" };
    if (!answer.ok) return { error: `could not load (${answer.status})` };
    try {
      const chart = await answer.json();
      if (!Array.isArray(chart.t) || !Array.isArray(chart.series)) return { error: "unexpected answer" };
      return { chart };
    } catch (_) {
      return { error: "unexpected answer" };
    }
  }

  async function update(element) {
    const state = charts.get(element);
    if (!state || !element.isConnected) return;
    const { chart, error } = await fetchChart(element.dataset.chart);
    if (!element.isConnected) return;
    if (error) {
      // Keep a chart already drawn (the next fetch may work); otherwise say why there is none.
      if (!state.plot) say(element, state, `${label(element)}: ${error}`);
      element.classList.add("chart-stale");
      return;
    }
    element.classList.remove("chart-stale");
    if (!hasPoints(chart)) {
      say(element, state, `${chart.title || label(element)}: no data yet`);
      return;
    }
    const data = [chart.t, ...chart.series.map((s) => s.values)];
    const key = JSON.stringify([chart.title, chart.unit, chart.series.map((s) => s.label)]);
    if (state.plot && state.key === key) {
      state.plot.setData(data);
      return;
    }
    if (state.plot) state.plot.destroy();
    element.replaceChildren();
    state.plot = new uPlot(options(chart, widthOf(element)), data, element);
    state.key = key;
  }

  function forget(element) {
    const state = charts.get(element);
    if (!state) return;
    clearInterval(state.timer);
    state.observer?.disconnect();
    state.plot?.destroy();
    charts.delete(element);
  }

  function start(element) {
    if (charts.has(element)) return;
    const state = { plot: null, key: null, timer: 0, observer: null };
    charts.set(element, state);
    if (typeof uPlot === "undefined") {
      say(element, state, `${label(element)}: charts unavailable (uPlot not loaded)`);
      return;
    }
    state.timer = setInterval(() => {
      if (!element.isConnected) forget(element);
      else if (document.visibilityState !== "hidden") update(element);
    }, REFRESH_MS);
    if (typeof ResizeObserver !== "undefined") {
      let last = 0;
      state.observer = new ResizeObserver(() => {
        const width = widthOf(element);
        if (state.plot && width !== last) state.plot.setSize({ width, height: HEIGHT });
        last = width;
      });
      state.observer.observe(element);
    }
    update(element);
  }

  function scan() {
    for (const element of charts.keys()) if (!element.isConnected) forget(element);
    document.querySelectorAll("[data-chart]").forEach(start);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", scan);
  else scan();
  document.addEventListener("htmx:afterSettle", scan);
})();
