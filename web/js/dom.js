// DOM and formatting helpers shared by every view.
//
// Everything that comes from the API (payloads, results, errors, tags, names)
// reaches the page through h() children or textContent, which the browser
// treats as text. Nothing in this dashboard assigns innerHTML.

const SVG_NS = "http://www.w3.org/2000/svg";

// The one status map of the dashboard comes from the API (GET /js/states.js,
// generated from the state machine). Each status is a CSS class (`st-<status>`)
// that sets --c (strong colour), --bg (tint) and --fg (text on the tint); pills,
// event badges, DAG boxes, bars and timeline dots all paint with those
// variables, so a colour means the same everywhere.
import {
  CANCELLABLE as CANCELLABLE_LIST, COLOURS, EVENT_STATUS, RESUMABLE as RESUMABLE_LIST,
  RETRYABLE as RETRYABLE_LIST, S, STATUSES,
} from "./states.js";

export { EVENT_STATUS, S, STATUSES };
export const CANCELLABLE = new Set(CANCELLABLE_LIST);
export const RETRYABLE = new Set(RETRYABLE_LIST);
export const RESUMABLE = new Set(RESUMABLE_LIST);

const statusSheet = new CSSStyleSheet();
statusSheet.replaceSync(Object.entries(COLOURS).map(([status, colour]) =>
  `.st-${status} { --c: ${colour.c}; --bg: ${colour.bg}; --fg: ${colour.fg}; }`).join("\n"));
document.adoptedStyleSheets = [...document.adoptedStyleSheets, statusSheet];

export function statusClass(status) {
  return STATUSES.includes(status) ? `st-${status}` : "st-unknown";
}

function setAttributes(el, attrs) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value == null || value === false) continue;
    if (key === "class") el.setAttribute("class", value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key === "style") {
      // Through the CSSOM, never as an attribute: the page's CSP (style-src 'self')
      // refuses inline style attributes, not properties set from a script.
      for (const part of String(value).split(";")) {
        const colon = part.indexOf(":");
        if (colon > 0) el.style.setProperty(part.slice(0, colon).trim(), part.slice(colon + 1).trim());
      }
    }
    else if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value);
    } else el.setAttribute(key, value === true ? "" : String(value));
  }
}

function appendChildren(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child == null || child === false) continue;
    // Element.append() turns strings into text nodes: never parsed as HTML.
    el.append(child instanceof Node ? child : String(child));
  }
}

/** h("a", {href: "#/x", class: "y"}, "text", child, [more]) -> an HTML element. */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  setAttributes(el, attrs);
  appendChildren(el, children);
  return el;
}

/** The same for SVG elements. */
export function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  setAttributes(el, attrs);
  appendChildren(el, children);
  return el;
}

export function clear(el) {
  el.replaceChildren();
  return el;
}

export function pill(status) {
  return h("span", { class: `pill ${statusClass(status)}`, "data-status": status || "" },
    status || "unknown");
}

export function eventBadge(type) {
  return h("span", { class: `etype ${statusClass(EVENT_STATUS[type])}` }, type);
}

// Ids are UUIDv7: the first characters are a timestamp shared by everything
// created in the same moment, so the short form is the random tail.
export function shortId(id) {
  return id ? String(id).slice(-8) : "";
}

export function jobLink(id, label) {
  return h("a", { href: `#/jobs/${encodeURIComponent(id)}`, class: "idlink", title: id },
    label ?? shortId(id));
}

export function workflowLink(id, label) {
  return h("a", { href: `#/workflows/${encodeURIComponent(id)}`, class: "idlink", title: id },
    label ?? shortId(id));
}

export function tagChips(tags, { link = true } = {}) {
  const entries = Object.entries(tags || {});
  if (!entries.length) return h("span", { class: "muted" }, "—");
  return h("span", { class: "tags" }, entries.map(([key, value]) => {
    const text = `${key}:${value}`;
    return link
      ? h("a", { class: "tag", href: `#/search?tag=${encodeURIComponent(text)}`, title: text }, text)
      : h("span", { class: "tag", title: text }, text);
  }));
}

const pad = (n, width = 2) => String(n).padStart(width, "0");

export function parseTime(iso) {
  if (!iso) return null;
  const time = new Date(iso);
  return Number.isNaN(time.getTime()) ? null : time;
}

/** "14:03:22" with ".123" as a separate, quieter element. */
export function clock(iso) {
  const time = parseTime(iso);
  if (!time) return h("span", { class: "muted" }, "—");
  return h("time", { datetime: iso, title: time.toLocaleString() },
    `${pad(time.getHours())}:${pad(time.getMinutes())}:${pad(time.getSeconds())}`,
    h("span", { class: "ms" }, `.${pad(time.getMilliseconds(), 3)}`));
}

const DATE_TIME = {
  year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit",
  hourCycle: "h23", timeZoneName: "short",
};

/** "2 Dec 2026, 14:03:22 UTC": in the browser's zone, or in `zone` (an IANA name), always
 * naming the zone; on one line (class "dt"). */
export function formatDateTime(time, zone) {
  try {
    return time.toLocaleString([], zone ? { ...DATE_TIME, timeZone: zone } : DATE_TIME);
  } catch { // a zone this browser does not know
    return time.toLocaleString([], DATE_TIME);
  }
}

export function dateTime(iso, { zone } = {}) {
  const time = parseTime(iso);
  if (!time) return h("span", { class: "muted" }, iso === "infinity" ? "never" : "—");
  return h("time", { datetime: iso, title: iso, class: "dt" }, formatDateTime(time, zone));
}

export function duration(seconds) {
  if (seconds == null || Number.isNaN(seconds)) return "—";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 60) return `${seconds.toFixed(seconds < 10 ? 1 : 0)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ${Math.round(seconds % 60)} s`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ${Math.round((seconds % 3600) / 60)} min`;
  return `${Math.floor(seconds / 86400)} d ${Math.round((seconds % 86400) / 3600)} h`;
}

export function ago(iso) {
  const time = parseTime(iso);
  if (!time) return "—";
  const seconds = (Date.now() - time.getTime()) / 1000;
  return seconds < 0 ? "just now" : `${duration(seconds)} ago`;
}

export function between(startIso, endIso) {
  const start = parseTime(startIso);
  const end = parseTime(endIso);
  return start && end ? duration((end - start) / 1000) : "—";
}

/** One line of JSON, cut to `max` characters. */
export function compact(value, max = 120) {
  let text;
  try {
    text = typeof value === "string" ? value : JSON.stringify(value);
  } catch {
    text = String(value);
  }
  if (text === undefined) text = "";
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

export function pretty(value) {
  if (value === undefined || value === null) return "null";
  if (typeof value === "string") return value;
  try {
    return JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

export function codeBlock(value, cls = "") {
  return h("pre", { class: `code ${cls}`.trim() }, pretty(value));
}

/** A definition list from [label, value] pairs (values: nodes or text). */
export function facts(pairs) {
  return h("dl", { class: "facts" }, pairs.filter(Boolean).map(([label, value]) => [
    h("dt", null, label),
    h("dd", null, value ?? h("span", { class: "muted" }, "—")),
  ]));
}

export function emptyState(text) {
  return h("div", { class: "empty" }, text);
}

/** A message that goes away on its own, for the outcome of a button. */
export function toast(text, kind = "info") {
  const host = document.getElementById("toasts");
  if (!host) return;
  const note = h("div", { class: `toast toast-${kind}`, role: "status" }, text);
  host.append(note);
  setTimeout(() => note.remove(), kind === "error" ? 7000 : 3500);
}

/** Calls `fn` at most once per `wait` ms, on the trailing edge. */
export function debounce(fn, wait) {
  let timer = null;
  const debounced = (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), wait);
  };
  debounced.cancel = () => clearTimeout(timer);
  return debounced;
}

/** Runs `load` one at a time: a call while it runs asks for one more run after it (one,
 * however many calls came), unless `gone()` says the view was left meanwhile. */
export function oneAtATime(load, gone) {
  let running = false;
  let again = false;
  async function run() {
    if (running) {
      again = true;
      return;
    }
    running = true;
    try {
      await load();
    } finally {
      running = false;
      if (again && !gone()) {
        again = false;
        run();
      }
    }
  }
  return run;
}

/**
 * Make `parent`'s children match `items` in order, rebuilding only the items
 * whose signature changed, so a live refresh does not replace the button
 * under the reader's mouse.
 */
export function syncChildren(parent, items, { key, signature, build }) {
  const existing = new Map();
  for (const child of parent.children) {
    if (child.dataset.key != null) existing.set(child.dataset.key, child);
  }
  const wanted = items.map((item) => {
    const id = String(key(item));
    const sig = signature(item);
    const current = existing.get(id);
    if (current && current.dataset.sig === sig) return current;
    const fresh = build(item);
    fresh.dataset.key = id;
    fresh.dataset.sig = sig;
    return fresh;
  });
  const wantedSet = new Set(wanted);
  for (const child of [...parent.children]) if (!wantedSet.has(child)) child.remove();
  wanted.forEach((child, index) => {
    if (parent.children[index] !== child) parent.insertBefore(child, parent.children[index] || null);
  });
}
