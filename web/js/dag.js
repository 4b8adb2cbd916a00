// The workflow DAG as an SVG picture: longest-path layers (left to right, or
// top to bottom when that fits the screen better), crossings reduced by
// barycenter sweeps, long edges routed through dummy points so they run
// between boxes rather than through them.

import { s, statusClass, S } from "./dom.js";
import { describeCondition } from "./summary.js";

const NODE_W = 168;
const NODE_H = 54;
const DUMMY = 12; // the room a long edge takes where it passes a layer
// Gaps between layers and between neighbours in a layer, per direction.
const GAPS = { LR: { layer: 80, within: 20 }, TB: { layer: 56, within: 22 } };
const LABEL_CHARS = 22; // edge labels are cut to this many characters
const LABEL_CHAR_PX = 6.7; // 11px monospace
const PAD = 22;
const MIN_SCALE = 0.8; // narrower than this and the card scrolls instead: text stays readable
const GOOD_SCALE = 0.85; // left to right unless it must shrink more than this
const SWEEPS = 4;

/** Edges of the picture: dependencies, the `when` source (dashed), failure handlers. */
export function graphEdges(steps) {
  const names = new Set(steps.map((step) => step.step));
  const edges = [];
  for (const step of steps) {
    const whenSource = step.when && names.has(step.when.step) ? step.when.step : null;
    for (const dependency of new Set(step.depends_on || [])) {
      if (dependency !== whenSource && names.has(dependency)) {
        edges.push({ from: dependency, to: step.step, kind: "dep" });
      }
    }
    if (whenSource) {
      edges.push({
        from: whenSource, to: step.step, kind: "when",
        label: describeCondition(step.when, { withStep: false }), title: `runs only when ${describeCondition(step.when)}`,
      });
    }
    if (step.on_failure && names.has(step.on_failure)) {
      edges.push({ from: step.step, to: step.on_failure, kind: "failure", label: "on failure" });
    }
  }
  return edges;
}

function longestPathLayers(names, edges) {
  const incoming = new Map(names.map((name) => [name, []]));
  for (const edge of edges) incoming.get(edge.to).push(edge.from);
  const layer = new Map();
  const visiting = new Set();
  const visit = (name) => {
    if (layer.has(name)) return layer.get(name);
    if (visiting.has(name)) return 0; // a cycle: the API rejects these; draw something anyway
    visiting.add(name);
    const value = Math.max(-1, ...incoming.get(name).map(visit)) + 1;
    visiting.delete(name);
    layer.set(name, value);
    return value;
  };
  names.forEach(visit);
  return layer;
}

/** Positions of every box and the route of every edge; direction "LR" or "TB". */
export function layoutDag(steps, direction = "LR") {
  const names = steps.map((step) => step.step);
  const edges = graphEdges(steps);
  const layerOf = longestPathLayers(names, edges);
  const layerCount = Math.max(0, ...layerOf.values()) + 1;
  const nodes = new Map(names.map((name) => [name, { id: name, layer: layerOf.get(name), dummy: false }]));
  const layers = Array.from({ length: layerCount }, () => []);
  names.forEach((name) => layers[layerOf.get(name)].push(nodes.get(name)));

  // Split edges that skip layers into chains through dummy nodes.
  const links = []; // [upper node, lower node] pairs between adjacent layers
  for (const edge of edges) {
    const chain = [nodes.get(edge.from)];
    for (let l = layerOf.get(edge.from) + 1; l < layerOf.get(edge.to); l += 1) {
      const dummy = { id: `${edge.from}->${edge.to}#${l}`, layer: l, dummy: true };
      layers[l].push(dummy);
      chain.push(dummy);
    }
    chain.push(nodes.get(edge.to));
    for (let i = 1; i < chain.length; i += 1) links.push([chain[i - 1], chain[i]]);
    edge.chain = chain;
  }

  // Barycenter ordering: sort each layer by the mean position of its neighbours.
  const index = new Map();
  const reindex = () => layers.forEach((layer) => layer.forEach((node, i) => index.set(node, i)));
  reindex();
  const neighbours = (node, upward) => links
    .filter(([a, b]) => (upward ? b === node : a === node))
    .map(([a, b]) => (upward ? a : b));
  const sortLayer = (layer, upward) => {
    const keyed = layer.map((node) => {
      const around = neighbours(node, upward);
      const key = around.length
        ? around.reduce((sum, other) => sum + index.get(other), 0) / around.length
        : index.get(node);
      return { node, key };
    });
    keyed.sort((a, b) => a.key - b.key || index.get(a.node) - index.get(b.node));
    layer.splice(0, layer.length, ...keyed.map((entry) => entry.node));
  };
  for (let sweep = 0; sweep < SWEEPS; sweep += 1) {
    for (let l = 1; l < layerCount; l += 1) { sortLayer(layers[l], true); reindex(); }
    for (let l = layerCount - 2; l >= 0; l -= 1) { sortLayer(layers[l], false); reindex(); }
  }

  // Coordinates, worked out along the layer axis ("along") and within a
  // layer ("across"), then mapped to x/y for the direction. Each layer is
  // centred across.
  const horizontal = direction === "LR";
  const gaps = { ...GAPS[horizontal ? "LR" : "TB"] };
  if (horizontal) {
    // A label on an edge between neighbouring layers sits in the gap: make room for it.
    const longest = Math.max(0, ...edges.filter((e) => e.label && e.chain.length === 2)
      .map((e) => Math.min(e.label.length, LABEL_CHARS)));
    gaps.layer = Math.max(gaps.layer, Math.round(longest * LABEL_CHAR_PX + 28));
  }
  const alongSize = horizontal ? NODE_W : NODE_H;
  const acrossSize = (node) => (node.dummy ? DUMMY : horizontal ? NODE_H : NODE_W);
  const layerSpan = (layer) => layer.reduce((sum, node) => sum + acrossSize(node), 0)
    + Math.max(0, layer.length - 1) * gaps.within;
  const widest = Math.max(horizontal ? NODE_H : NODE_W, ...layers.map(layerSpan));
  layers.forEach((layer, l) => {
    let across = PAD + (widest - layerSpan(layer)) / 2;
    const along = PAD + l * (alongSize + gaps.layer);
    for (const node of layer) {
      const [w, hgt] = horizontal ? [alongSize, acrossSize(node)] : [acrossSize(node), alongSize];
      Object.assign(node, horizontal ? { x: along, y: across } : { x: across, y: along }, { w, h: hgt });
      node.cx = node.x + w / 2;
      node.cy = node.y + hgt / 2;
      across += acrossSize(node) + gaps.within;
    }
  });
  const alongTotal = PAD * 2 + layerCount * alongSize + Math.max(0, layerCount - 1) * gaps.layer;
  const acrossTotal = PAD * 2 + widest;
  return {
    nodes,
    edges,
    direction: horizontal ? "LR" : "TB",
    width: horizontal ? alongTotal : acrossTotal,
    height: horizontal ? acrossTotal : alongTotal,
  };
}

function edgePath(chain, horizontal) {
  // Leave the source at its far side, pass each dummy straight, enter the
  // target at its near side (3 px short, for the arrowhead).
  const exit = (n) => (horizontal ? { x: n.x + n.w, y: n.cy } : { x: n.cx, y: n.y + n.h });
  const entry = (n, gap = 0) => (horizontal ? { x: n.x - gap, y: n.cy } : { x: n.cx, y: n.y - gap });
  const points = [exit(chain[0])];
  for (const node of chain.slice(1, -1)) points.push(entry(node), exit(node));
  points.push(entry(chain[chain.length - 1], 3));
  let d = `M${points[0].x},${points[0].y}`;
  for (let i = 1; i < points.length; i += 1) {
    const [p, q] = [points[i - 1], points[i]];
    if (i % 2 === 0) { // through a dummy
      d += ` L${q.x},${q.y}`;
    } else if (horizontal) {
      const dx = (q.x - p.x) / 2;
      d += ` C${p.x + dx},${p.y} ${q.x - dx},${q.y} ${q.x},${q.y}`;
    } else {
      const dy = (q.y - p.y) / 2;
      d += ` C${p.x},${p.y + dy} ${q.x},${q.y - dy} ${q.x},${q.y}`;
    }
  }
  // Left to right, a long edge's label sits on its straight run past a layer
  // (a box's width of room); otherwise in the middle of the last curve (for
  // these symmetric curves: the midpoint of its two ends).
  if (horizontal && chain.length > 2) {
    const middle = chain[Math.floor(chain.length / 2)];
    return { d, labelAt: { x: middle.cx, y: middle.cy } };
  }
  const [p, q] = points.slice(-2);
  return { d, labelAt: { x: (p.x + q.x) / 2, y: (p.y + q.y) / 2 } };
}

/** Left to right when it fits `available` pixels well enough, else whichever shrinks less. */
export function chooseLayout(steps, available) {
  const wide = layoutDag(steps, "LR");
  const wideScale = available / wide.width;
  if (!available || wideScale >= GOOD_SCALE) return wide;
  const tall = layoutDag(steps, "TB");
  return available / tall.width > wideScale ? tall : wide;
}

function ellipsize(text, max) {
  const value = String(text ?? "");
  return value.length > max ? `${value.slice(0, max - 1)}…` : value;
}

function kindText(step) {
  const type = step.type || step.step_type;
  if (type === "wait_for_trigger") return "trigger";
  if (type === "sleep") return step.seconds != null ? `sleep ${step.seconds}s` : "sleep";
  if (type === "workflow") return `↳ ${step.definition || "workflow"}`;
  return step.task || type || "task";
}

/** A fan-out step's node: how many of its elements succeeded, of all. */
function elementsText(step) {
  const elements = step.elements;
  if (!elements || !elements.total) return null;
  return `${(elements.counts || {})[S.SUCCEEDED] || 0}/${elements.total}`;
}

function subtitle(step) {
  const parts = [step.status || "unknown", kindText(step)];
  const fanned = elementsText(step);
  if (fanned) parts.push(fanned);
  if (step.attempts > 1) parts.push(`×${step.attempts}`);
  return ellipsize(parts.join(" · "), 26);
}

export function isTriggerable(step) {
  const type = step.type || step.step_type;
  return step.status === S.WAITING && (type === "wait_for_trigger" || type == null);
}

function marker(id, cls) {
  return s("marker", {
    id, viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7,
    orient: "auto-start-reverse", class: cls,
  }, s("path", { d: "M0,0 L10,5 L0,10 z" }));
}

/**
 * Draws the DAG to fit `available` pixels of width. `onSelect(stepName)` runs
 * when a box is clicked. Returns {svg, update(steps), select(name), sameShape(steps), ...}.
 */
export function renderDag(steps, { onSelect, selected, available } = {}) {
  const layout = chooseLayout(steps, available);
  const shapeKey = JSON.stringify(layout.edges.map((e) => [e.from, e.to, e.kind]).concat([steps.map((st) => st.step)]));
  const svg = s("svg", {
    class: `dag dag-${layout.direction}`, id: "dag", "data-direction": layout.direction, width: layout.width, height: layout.height,
    viewBox: `0 0 ${layout.width} ${layout.height}`, role: "img",
    "aria-label": `Workflow graph with ${steps.length} steps`,
  }, s("defs", null,
    marker("arrow-dep", "marker-dep"), marker("arrow-when", "marker-when"),
    marker("arrow-failure", "marker-failure")));

  const edgeLayer = s("g", { class: "edges" });
  const labelLayer = s("g", { class: "edge-labels" });
  for (const edge of layout.edges) {
    const { d, labelAt } = edgePath(edge.chain, layout.direction === "LR");
    edgeLayer.append(s("path", {
      class: `edge edge-${edge.kind}`, d, "marker-end": `url(#arrow-${edge.kind})`,
      "data-from": edge.from, "data-to": edge.to,
    }, s("title", null, `${edge.from} → ${edge.to}${edge.label ? ` (${edge.label})` : ""}`)));
    if (edge.label) {
      labelLayer.append(s("g", {
        class: `edge-label edge-label-${edge.kind}`, transform: `translate(${labelAt.x},${labelAt.y})`,
      }, s("rect", { x: -40, y: -9, width: 80, height: 18, rx: 4 }),
      s("text", { "text-anchor": "middle", y: 4 }, ellipsize(edge.label, LABEL_CHARS)),
      s("title", null, edge.title || edge.label)));
    }
  }

  const nodeLayer = s("g", { class: "nodes" });
  const boxes = new Map();
  for (const step of steps) {
    const node = layout.nodes.get(step.step);
    const name = s("text", { class: "name", x: 16, y: 23 }, ellipsize(step.step, 19));
    const sub = s("text", { class: "sub", x: 16, y: 41 }, subtitle(step));
    const tooltip = s("title", null, `${step.step} — ${step.status}`);
    // Sits on the box's top edge, clear of the text: "this one needs you".
    const badge = s("g", { class: "trigger-badge", transform: `translate(${NODE_W - 66},-10)` },
      s("rect", { width: 58, height: 20, rx: 10 }),
      s("text", { x: 29, y: 14, "text-anchor": "middle" }, "trigger ▸"));
    const group = s("g", {
      class: `node ${statusClass(step.status)}`, transform: `translate(${node.x},${node.y})`,
      "data-step": step.step, "data-status": step.status, tabindex: 0, role: "button",
      "aria-label": `step ${step.step}, ${step.status}`,
    }, tooltip,
    s("rect", { class: "box", width: NODE_W, height: NODE_H, rx: 9 }),
    s("rect", { class: "stripe", x: 0, y: 0, width: 6, height: NODE_H, rx: 3 }),
    name, sub, badge);
    badge.style.display = isTriggerable(step) ? "" : "none";
    const choose = () => onSelect && onSelect(step.step);
    group.addEventListener("click", choose);
    group.addEventListener("keydown", (key) => {
      if (key.key === "Enter" || key.key === " ") {
        key.preventDefault();
        choose();
      }
    });
    boxes.set(step.step, { group, sub, tooltip, badge });
    nodeLayer.append(group);
  }
  svg.append(edgeLayer, nodeLayer, labelLayer);

  function select(nameToSelect) {
    for (const [stepName, box] of boxes) box.group.classList.toggle("selected", stepName === nameToSelect);
  }

  function update(nextSteps) {
    for (const step of nextSteps) {
      const box = boxes.get(step.step);
      if (!box) continue;
      const wasSelected = box.group.classList.contains("selected");
      box.group.setAttribute("class", `node ${statusClass(step.status)}${wasSelected ? " selected" : ""}`);
      box.group.setAttribute("data-status", step.status);
      box.group.setAttribute("aria-label", `step ${step.step}, ${step.status}`);
      box.sub.textContent = subtitle(step);
      box.tooltip.textContent = `${step.step} — ${step.status}`;
      box.badge.style.display = isTriggerable(step) ? "" : "none";
    }
  }

  function sameShape(nextSteps) {
    const next = layoutDag(nextSteps, layout.direction);
    return JSON.stringify(next.edges.map((e) => [e.from, e.to, e.kind]).concat([nextSteps.map((st) => st.step)])) === shapeKey;
  }

  /** Size label backgrounds to their text (needs the SVG in the document). */
  function fitLabels() {
    for (const label of labelLayer.querySelectorAll(".edge-label")) {
      const text = label.querySelector("text");
      const rect = label.querySelector("rect");
      const width = text.getComputedTextLength() + 12;
      rect.setAttribute("x", String(-width / 2));
      rect.setAttribute("width", String(width));
    }
  }

  /** Shrink the picture to `available` pixels wide, down to MIN_SCALE. */
  function fitWidth(available) {
    const scale = Math.max(MIN_SCALE, Math.min(1, available / layout.width));
    svg.setAttribute("width", String(Math.round(layout.width * scale)));
    svg.setAttribute("height", String(Math.round(layout.height * scale)));
  }

  select(selected);
  return { svg, update, select, sameShape, fitLabels, fitWidth, direction: layout.direction };
}
