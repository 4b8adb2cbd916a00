// Overview: the last 15 minutes in three charts, from GET /stats/recent (refreshed every 5 s).

import { api, ApiError } from "./api.js";
import { lineChart, PALETTE } from "./charts.js";
import { clear, h } from "./dom.js";
import { COLOURS } from "./states.js";

const REFRESH_MS = 5000;
// Each outcome in its status's colour, as on every pill ("failed": a failed attempt).
const OUTCOME_COLOURS = Object.fromEntries(["succeeded", "failed", "dead", "cancelled"]
  .map((status) => [status, COLOURS[status].c]));
// Depth is sampled only while someone asks for the stats (this page, every REFRESH_MS): two
// samples further apart than this had nobody looking between them, and the line breaks there.
const DEPTH_GAP_SECONDS = (2 * REFRESH_MS) / 1000 + 1;

/** [t, value] points with a null between samples too far apart to join. */
function withGaps(samples, value) {
  const points = [];
  samples.forEach((sample, index) => {
    if (index && sample.t - samples[index - 1].t > DEPTH_GAP_SECONDS) points.push([sample.t, null]);
    points.push([sample.t, value(sample)]);
  });
  return points;
}

function charts(stats) {
  const to = stats.now;
  const from = to - stats.window_seconds;
  const throughput = Object.entries(OUTCOME_COLOURS).map(([name, colour]) => ({
    name, colour, points: stats.throughput.map((b) => [b.t + stats.bucket_seconds / 2, b[name]]),
  }));
  const queues = [...new Set(stats.depth.flatMap((sample) => Object.keys(sample.queues)))].sort();
  const depth = queues.map((queue, index) => ({
    name: queue, colour: PALETTE[index % PALETTE.length],
    points: withGaps(stats.depth, (sample) => sample.queues[queue] ?? 0),
  }));
  const latency = ["p50", "p99"].map((name) => ({
    name, colour: name === "p50" ? PALETTE[2] : PALETTE[4],
    points: stats.latency.map((b) => [b.t + stats.bucket_seconds / 2, b[name]]),
  }));
  return [
    lineChart({ id: "chart-throughput", title: "Jobs finished per second, by outcome", series: throughput, from, to, unit: "/s" }),
    lineChart({ id: "chart-depth", title: "Pending jobs per queue", series: depth, from, to }),
    lineChart({ id: "chart-latency", title: "Enqueue to start (seconds)", series: latency, from, to, unit: "s" }),
  ];
}

export function mountOverview(container) {
  const grid = h("div", { class: "charts", id: "charts", "aria-busy": "true" });
  const message = h("p", { class: "form-message", "aria-live": "polite" });
  const totals = h("p", { class: "muted", id: "overview-totals" });
  clear(container).append(h("section", { class: "view overview" },
    h("div", { class: "toolbar" }, h("h1", null, "Overview"),
      h("span", { class: "muted" }, "last 15 minutes, 10-second buckets")),
    totals, message, grid));
  let stopped = false;
  let timer = null;

  async function refresh() {
    try {
      const stats = await api("/stats/recent");
      if (stopped) return;
      const finished = stats.throughput.reduce((sum, b) => sum + (b.succeeded + b.dead + b.cancelled) * stats.bucket_seconds, 0);
      totals.textContent = `${Math.round(finished)} jobs finished in the last 15 minutes`;
      clear(grid).append(...charts(stats));
      grid.removeAttribute("aria-busy");
      message.textContent = "";
    } catch (error) {
      if (!stopped) message.textContent = error instanceof ApiError ? error.message : "Could not load the stats; retrying.";
    } finally {
      if (!stopped) timer = setTimeout(refresh, REFRESH_MS);
    }
  }
  refresh();
  return () => { stopped = true; clearTimeout(timer); };
}
