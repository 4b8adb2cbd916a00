// The live timeline: every event as it happens, newest first, bounded in memory.
//
// The model (events, pause buffer, known queues) lives for the whole page, so
// events keep arriving while another view is open; the view is built from it
// whenever the timeline is shown.

import { api, itemsOf } from "./api.js";
import {
  clear, clock, codeBlock, eventBadge, h, jobLink, shortId, tagChips, workflowLink,
} from "./dom.js";
import { EVENT_TYPES, jobInfo, onJobInfo, streamName, subscribe, workflowName } from "./live.js";
import { summarize } from "./summary.js";

const MAX_EVENTS = 500; // kept in memory and on screen
const MAX_BUFFER = 1000; // held back while paused; older ones are dropped
const FLUSH_MS = 60; // bursts are drawn together

const events = []; // newest first
const buffer = []; // oldest first, while paused
const knownQueues = new Set(["default"]);
let droppedWhilePaused = 0;
let paused = false;
let view = null;

export function startTimeline() {
  subscribe(receive);
  onJobInfo((id) => view && view.jobInfoArrived(id));
}

function receive(event) {
  if (event.type === "Enqueued" && event.data && event.data.queue) knownQueues.add(event.data.queue);
  if (paused) {
    buffer.push(event);
    if (buffer.length > MAX_BUFFER) {
      buffer.shift();
      droppedWhilePaused += 1;
    }
    if (view) view.showPaused();
    return;
  }
  add([event]);
}

function add(oldestFirst) {
  for (const event of oldestFirst) events.unshift(event);
  const removed = events.length > MAX_EVENTS ? events.splice(MAX_EVENTS) : [];
  if (view) view.added(oldestFirst, removed);
}

function setPaused(value) {
  paused = value;
  if (!paused) {
    const held = buffer.splice(0);
    droppedWhilePaused = 0;
    add(held);
  }
  if (view) view.showPaused();
}

// ---------------------------------------------------------------------------

function parseFilters(params) {
  return {
    type: params.get("type") || "",
    queue: params.get("queue") || "",
    workflow: (params.get("workflow") || "").trim(),
    actor: (params.get("actor") || "").trim(),
    heartbeats: params.get("heartbeats") === "1",
  };
}

function matches(event, filters) {
  if (event.type === "Heartbeat" && !filters.heartbeats && filters.type !== "Heartbeat") return false;
  if (filters.type && event.type !== filters.type) return false;
  if (filters.actor && event.actor !== filters.actor) return false;
  if (filters.workflow) {
    const workflowId = event.workflow_id || (event.stream_type === "workflow" ? event.stream_id : "");
    if (!String(workflowId || "").includes(filters.workflow)) return false;
  }
  if (filters.queue) {
    if (event.stream_type !== "job") return false;
    const info = jobInfo(event.stream_id);
    if ((info.queue || (event.type === "Enqueued" && event.data && event.data.queue)) !== filters.queue) {
      return false;
    }
  }
  return true;
}

// The page of each kind of stream that has one (tokens and definitions have none here).
const STREAM_PAGES = {
  job: (id) => `#/jobs/${encodeURIComponent(id)}`,
  workflow: (id) => `#/workflows/${encodeURIComponent(id)}`,
  schedule: () => "#/schedules",
  queue: () => "#/queues",
};

/** The name a row shows for its stream: a job's task, any other stream's own name. */
function streamLabel(event) {
  const data = event.data || {};
  if (event.stream_type === "job") {
    const info = jobInfo(event.stream_id);
    return info.task ?? data.task ?? shortId(event.stream_id);
  }
  return streamName(event.stream_type, event.stream_id) ?? data.name ?? data.queue ?? shortId(event.stream_id);
}

function executionCell(event) {
  const kind = event.stream_type || "stream";
  const page = STREAM_PAGES[kind];
  const label = streamLabel(event);
  const title = `${kind} ${event.stream_id}`;
  const workflowId = kind === "workflow" ? null : event.workflow_id;
  return h("td", { class: "exec" },
    h("span", { class: "kind" }, kind), " ",
    page ? h("a", { href: page(event.stream_id), class: "idlink", title }, label) : h("span", { title }, label),
    workflowId
      ? [" ", h("span", { class: "in" }, "in"), " ",
        workflowLink(workflowId, workflowName(workflowId) ?? shortId(workflowId))]
      : null);
}

function jobCells(event) {
  if (event.stream_type !== "job") return [h("td", { class: "muted" }, "—"), h("td", { class: "muted" }, "—")];
  const info = jobInfo(event.stream_id);
  const data = event.data || {};
  const step = info.step ?? data.step;
  const queue = info.queue ?? data.queue;
  return [
    h("td", { class: "step" }, step ?? (info.loading ? "…" : h("span", { class: "muted" }, "—"))),
    h("td", { class: "queue" }, queue ?? (info.loading ? "…" : "—")),
  ];
}

function eventRow(event) {
  const summary = summarize(event);
  return h("tr", {
    class: "ev", "data-position": event.position, "data-type": event.type,
    "data-stream": event.stream_id, "data-kind": event.stream_type,
    "data-job": event.stream_type === "job" ? event.stream_id : null, "data-workflow": event.workflow_id,
    tabindex: 0,
  },
  h("td", { class: "time" }, clock(event.occurred_at)),
  h("td", { class: "type" }, eventBadge(event.type)),
  executionCell(event),
  ...jobCells(event),
  h("td", { class: "tagcell" }, tagChips(event.tags)),
  h("td", { class: "actor" }, event.actor ?? "—"),
  h("td", { class: "summary", title: summary }, summary));
}

function detailRow(event) {
  return h("tr", { class: "detail" }, h("td", { colspan: 8 },
    h("div", { class: "detail-meta" },
      `position ${event.position} · version ${event.version} · actor ${event.actor ?? "—"} · `,
      `${event.occurred_at ?? ""}`),
    codeBlock(event.data)));
}

function selectOf(name, options, value, label) {
  return h("label", { class: "field" }, h("span", null, label),
    h("select", { name, id: `filter-${name}` },
      options.map(([optionValue, text]) => h("option", {
        value: optionValue, selected: optionValue === value,
      }, text))));
}

export function mountTimeline(container, params) {
  const filters = parseFilters(params);
  if (filters.queue) knownQueues.add(filters.queue); // a link may name a queue we have not seen yet
  const tbody = h("tbody", { id: "timeline-rows" });
  const rowsByPosition = new Map();
  const pauseButton = h("button", { class: "btn", id: "pause", type: "button" });
  const pausedNote = h("span", { class: "paused-note", id: "paused-note", "aria-live": "polite" });
  const empty = h("div", { class: "empty", id: "timeline-empty" },
    "Waiting for events. Enqueue a job or run ",
    h("code", null, "qforge demo"), " to see it move.");
  const count = h("span", { class: "count" });

  const typeSelect = selectOf("type", [["", "All types"], ...EVENT_TYPES.map((t) => [t, t])],
    filters.type, "Type");
  const queueOptions = () => [["", "All queues"], ...[...knownQueues].sort().map((q) => [q, q])];
  const queueSelect = selectOf("queue", queueOptions(), filters.queue, "Queue");
  const workflowInput = h("input", {
    id: "filter-workflow", name: "workflow", value: filters.workflow, placeholder: "workflow id",
    spellcheck: "false", autocomplete: "off",
  });
  const actorInput = h("input", {
    id: "filter-actor", name: "actor", value: filters.actor, placeholder: "token, worker…",
    spellcheck: "false", autocomplete: "off",
  });
  const heartbeats = h("input", { type: "checkbox", id: "filter-heartbeats", checked: filters.heartbeats });

  let pending = [];
  let flushTimer = null;

  function refreshQueueOptions() {
    const select = queueSelect.querySelector("select");
    if (select.options.length === knownQueues.size + 1) return;
    const current = select.value;
    select.replaceChildren(...queueOptions().map(([value, text]) =>
      h("option", { value, selected: value === current }, text)));
  }

  function updateCount() {
    const shown = rowsByPosition.size;
    count.textContent = `${shown} shown · ${events.length} kept (max ${MAX_EVENTS})`;
    empty.hidden = shown > 0;
  }

  function renderAll() {
    pending = [];
    rowsByPosition.clear();
    const rows = [];
    for (const event of events) {
      if (!matches(event, filters)) continue;
      const row = eventRow(event);
      rowsByPosition.set(event.position, row);
      rows.push(row);
    }
    tbody.replaceChildren(...rows);
    updateCount();
  }

  function flush() {
    flushTimer = null;
    let batch = pending;
    pending = [];
    if (batch.length > 50) {
      // A burst may have pushed some of its own events out of memory already.
      const kept = new Set(events.map((e) => e.position));
      batch = batch.filter((e) => kept.has(e.position));
    }
    const rows = [];
    for (const event of batch) {
      if (!matches(event, filters)) continue;
      const row = eventRow(event);
      row.classList.add("fresh");
      rowsByPosition.set(event.position, row);
      rows.unshift(row);
    }
    if (rows.length) tbody.prepend(...rows);
    refreshQueueOptions();
    updateCount();
  }

  function showPaused() {
    pauseButton.textContent = paused ? "Resume" : "Pause";
    pauseButton.classList.toggle("primary", paused);
    pauseButton.setAttribute("aria-pressed", String(paused));
    if (!paused) {
      pausedNote.textContent = "";
      return;
    }
    pausedNote.textContent = buffer.length
      ? `Paused · ${buffer.length} new event${buffer.length === 1 ? "" : "s"} waiting`
        + (droppedWhilePaused ? ` (${droppedWhilePaused} older ones dropped)` : "")
      : "Paused";
  }

  function syncHash() {
    const search = new URLSearchParams();
    if (filters.type) search.set("type", filters.type);
    if (filters.queue) search.set("queue", filters.queue);
    if (filters.workflow) search.set("workflow", filters.workflow);
    if (filters.actor) search.set("actor", filters.actor);
    if (filters.heartbeats) search.set("heartbeats", "1");
    const text = search.toString();
    history.replaceState(null, "", `#/timeline${text ? `?${text}` : ""}`);
  }

  function onFilterChange() {
    filters.type = typeSelect.querySelector("select").value;
    filters.queue = queueSelect.querySelector("select").value;
    filters.workflow = workflowInput.value.trim();
    filters.actor = actorInput.value.trim();
    filters.heartbeats = heartbeats.checked;
    syncHash();
    renderAll();
  }

  typeSelect.addEventListener("change", onFilterChange);
  queueSelect.addEventListener("change", onFilterChange);
  workflowInput.addEventListener("input", onFilterChange);
  actorInput.addEventListener("input", onFilterChange);
  heartbeats.addEventListener("change", onFilterChange);
  pauseButton.addEventListener("click", () => setPaused(!paused));

  tbody.addEventListener("click", (click) => {
    if (click.target.closest("a")) return;
    const row = click.target.closest("tr.ev");
    if (!row) return;
    const next = row.nextElementSibling;
    if (next && next.classList.contains("detail")) {
      next.remove();
      return;
    }
    const event = events.find((e) => String(e.position) === row.dataset.position);
    if (event) row.after(detailRow(event));
  });

  view = {
    added(oldestFirst, removed) {
      for (const event of removed) {
        const row = rowsByPosition.get(event.position);
        if (!row) continue;
        const next = row.nextElementSibling;
        if (next && next.classList.contains("detail")) next.remove();
        row.remove();
        rowsByPosition.delete(event.position);
      }
      pending.push(...oldestFirst);
      if (pending.length > MAX_EVENTS) pending = pending.slice(-MAX_EVENTS);
      if (!flushTimer) flushTimer = setTimeout(flush, FLUSH_MS);
    },
    showPaused,
    jobInfoArrived(id) {
      if (filters.queue) {
        renderAll();
        return;
      }
      const which = CSS.escape(id); // a job's info, or the name of a workflow or schedule, arrived
      for (const row of tbody.querySelectorAll(`tr.ev[data-stream="${which}"], tr.ev[data-workflow="${which}"]`)) {
        const event = events.find((e) => String(e.position) === row.dataset.position);
        if (!event) continue;
        const fresh = eventRow(event);
        rowsByPosition.set(event.position, fresh);
        row.replaceWith(fresh);
      }
    },
  };

  api("/queues").then((body) => {
    for (const item of itemsOf(body, "queues")) {
      const name = item && (item.queue ?? item.name);
      if (name) knownQueues.add(name);
    }
    refreshQueueOptions();
  }).catch(() => {});

  clear(container).append(
    h("section", { class: "view timeline" },
      h("div", { class: "toolbar" },
        h("h1", null, "Live timeline"),
        pauseButton, pausedNote,
        h("div", { class: "spacer" }),
        typeSelect, queueSelect,
        h("label", { class: "field" }, h("span", null, "Workflow"), workflowInput),
        h("label", { class: "field" }, h("span", null, "By"), actorInput),
        h("label", { class: "check" }, heartbeats, " heartbeats")),
      h("div", { class: "table-wrap" },
        h("table", { class: "events" },
          h("thead", null, h("tr", null,
            h("th", { class: "time" }, "Time"), h("th", { class: "type" }, "Event"),
            h("th", { class: "exec" }, "Stream"), h("th", { class: "step" }, "Step"),
            h("th", { class: "queue" }, "Queue"), h("th", { class: "tagcell" }, "Tags"),
            h("th", { class: "actor" }, "By"),
            h("th", null, "Summary"))),
          tbody),
        empty),
      h("div", { class: "footnote" }, count)));

  renderAll();
  showPaused();
  return () => {
    clearTimeout(flushTimer);
    view = null;
  };
}
