// Line charts in plain SVG: no library, no build step. One function, lineChart(), draws time
// series on a shared x range with a few gridlines, axis labels and a legend.

import { h, s } from "./dom.js";

const WIDTH = 520;
const HEIGHT = 190;
const PAD = { left: 44, right: 10, top: 10, bottom: 22 };
// Colours for series that are not statuses (queues, percentiles): none of them is a status
// colour (states.js), so a green line never means "succeeded" unless it is.
export const PALETTE = ["#0d9488", "#db2777", "#0891b2", "#a16207", "#c026d3", "#1e293b", "#4d7c0f", "#e879f9"];

function niceMax(value) {
  if (!(value > 0)) return 1;
  const step = 10 ** Math.floor(Math.log10(value));
  for (const factor of [1, 2, 2.5, 5, 10]) if (factor * step >= value) return factor * step;
  return 10 * step;
}

function label(value, unit) {
  const text = value >= 100 ? value.toFixed(0) : value >= 10 ? value.toFixed(1) : +value.toFixed(2);
  return unit ? `${text}${unit}` : String(text);
}

function clockLabel(seconds) {
  return new Date(seconds * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
}

/**
 * series: [{name, colour?, points: [[t (Unix seconds), value | null], ...]}]; from/to: the x range.
 * A null value breaks the line (no data in that bucket).
 */
export function lineChart({ title, series, from, to, unit = "", id }) {
  const innerW = WIDTH - PAD.left - PAD.right;
  const innerH = HEIGHT - PAD.top - PAD.bottom;
  const values = series.flatMap((one) => one.points.map(([, v]) => v)).filter((v) => v != null);
  const top = niceMax(Math.max(0, ...values));
  const x = (t) => PAD.left + ((t - from) / Math.max(1, to - from)) * innerW;
  const y = (v) => PAD.top + innerH - (v / top) * innerH;
  const grid = [];
  for (let i = 0; i <= 4; i += 1) {
    const value = (top * i) / 4;
    grid.push(s("line", { x1: PAD.left, x2: WIDTH - PAD.right, y1: y(value), y2: y(value), class: "grid" }),
      s("text", { x: PAD.left - 6, y: y(value) + 4, class: "axis", "text-anchor": "end" }, label(value, unit)));
  }
  for (let i = 0; i <= 3; i += 1) {
    const t = from + ((to - from) * i) / 3;
    grid.push(s("text", { x: x(t), y: HEIGHT - 6, class: "axis", "text-anchor": i === 0 ? "start" : i === 3 ? "end" : "middle" },
      clockLabel(t)));
  }
  const lines = series.flatMap((one, index) => {
    const colour = one.colour || PALETTE[index % PALETTE.length];
    let d = "";
    let pen = "M";
    const dots = []; // a point with no neighbour draws no line: show it as a dot
    one.points.forEach(([t, v], i) => {
      if (v == null) { pen = "M"; return; }
      d += `${pen}${x(t).toFixed(1)},${y(v).toFixed(1)} `;
      pen = "L";
      if (one.points[i - 1]?.[1] == null && one.points[i + 1]?.[1] == null) {
        dots.push(s("circle", { cx: x(t).toFixed(1), cy: y(v).toFixed(1), r: 2.5, fill: colour }));
      }
    });
    return [s("path", { d: d.trim() || "M0,0", stroke: colour, class: "series", "data-series": one.name }), ...dots];
  });
  const legend = h("ul", { class: "legend" }, series.map((one, index) => h("li", null,
    h("span", { class: "swatch", style: `background:${one.colour || PALETTE[index % PALETTE.length]}` }),
    one.name)));
  return h("figure", { class: "chart card", id },
    h("figcaption", null, title),
    s("svg", { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, role: "img", "aria-label": title }, ...grid, ...lines),
    legend);
}
