// The Jobs and Workflows lists: filters kept in the URL, "Show more" paging, rows that follow
// the live stream (a shown row is re-read when one of its events arrives; new executions that
// match the filters appear at the top).

import { api, ApiError, query } from "./api.js";
import {
  clear, dateTime, emptyState, h, jobLink, pill, tagChips, workflowLink,
} from "./dom.js";
import { onJobInfo, subscribe, workflowName } from "./live.js";
import { bulkBar } from "./bulk.js";
import { JOB_STATUSES, WORKFLOW_STATUSES } from "./states.js";

const PAGE = 50;
const REREAD_LIMIT = 25; // rows re-read per live flush; the rest wait for the next events

function stepCounts(counts) {
  return Object.entries(counts || {}).filter(([, n]) => n)
    .map(([status, n]) => h("span", { class: "count" }, pill(status), ` ${n}`));
}

/** A fan-out's elements, apart from the steps: "elements: 3 succeeded, 1 dead". */
function elementCounts(counts) {
  const entries = Object.entries(counts || {}).filter(([, n]) => n);
  if (!entries.length) return null;
  return h("span", { class: "element-counts" },
    `elements: ${entries.map(([status, n]) => `${n} ${status}`).join(", ")}`);
}

/** A link to a job's workflow, by the workflow's name (filled in when it arrives). */
function workflowCell(id) {
  if (!id) return "";
  const link = workflowLink(id, workflowName(id) ?? "…");
  link.dataset.workflowName = id;
  return link;
}

const KINDS = {
  jobs: {
    title: "Jobs", route: "#/jobs", path: "/jobs", filters: ["status", "queue", "task", "tag"],
    statuses: JOB_STATUSES, created: "Enqueued",
    headings: ["Id", "Task", "Status", "Queue", "Attempts", "Tags", "Created", "Workflow"],
    owns: (event) => (event.stream_type === "job" ? event.stream_id : null),
    read: (id) => api(`/jobs/${id}`),
    row: (job) => [jobLink(job.id), job.step ? `${job.step} (${job.task})` : job.task, pill(job.status),
      job.queue, `${job.counted_attempts ?? job.attempts} / ${job.max_retries + 1}`, tagChips(job.tags), dateTime(job.created_at),
      workflowCell(job.workflow_id)],
  },
  workflows: {
    title: "Workflows", route: "#/workflows", path: "/workflows", filters: ["status", "name", "tag"],
    statuses: WORKFLOW_STATUSES, created: "WorkflowSubmitted",
    headings: ["Id", "Name", "Status", "Steps", "Tags", "Created", "Finished"],
    owns: (event) => event.workflow_id || null,
    // A workflow's full view has what the summary shows, step counts included.
    read: async (id) => {
      const view = await api(`/workflows/${id}`);
      const counts = {};
      const elements = {};
      for (const step of view.steps) {
        counts[step.status] = (counts[step.status] || 0) + 1;
        for (const [status, n] of Object.entries(step.elements?.counts || {})) elements[status] = (elements[status] || 0) + n;
      }
      return { ...view, step_counts: counts, element_counts: elements };
    },
    row: (wf) => [workflowLink(wf.id), wf.name, pill(wf.status),
      h("span", { class: "counts" }, stepCounts(wf.step_counts), elementCounts(wf.element_counts)),
      tagChips(wf.tags), dateTime(wf.created_at), wf.finished_at ? dateTime(wf.finished_at) : "—"],
  },
};

function filterInput(kind, name, value) {
  if (name === "status") {
    return h("select", { name, id: `filter-${name}`, "aria-label": "Status" },
      h("option", { value: "" }, "any status"),
      kind.statuses.map((status) => h("option", { value: status, selected: status === value }, status)));
  }
  const placeholders = { queue: "queue", task: "task", name: "workflow name", tag: "key:value" };
  return h("input", { name, id: `filter-${name}`, value: value || "", placeholder: placeholders[name],
    autocomplete: "off", spellcheck: "false", "aria-label": placeholders[name] });
}

export function mountList(container, params, which) {
  const kind = KINDS[which];
  const filters = Object.fromEntries(kind.filters.map((name) => [name, params.get(name) || ""]));
  const inputs = kind.filters.map((name) => filterInput(kind, name, filters[name]));
  const form = h("form", { class: "filters", id: `${which}-filters` }, inputs,
    h("button", { class: "btn primary", type: "submit" }, "Filter"),
    h("a", { class: "btn", href: kind.route }, "Clear"));
  const message = h("p", { class: "form-message", "aria-live": "polite" });
  const tbody = h("tbody", { id: `${which}-rows` });
  const more = h("button", { class: "btn", type: "button", id: `${which}-more`, hidden: true }, "Show more");
  const count = h("p", { class: "muted", id: `${which}-count` });
  const table = h("div", { class: "table-wrap" }, h("table", { class: "list" },
    h("thead", null, h("tr", null, kind.headings.map((label) => h("th", null, label)))), tbody));
  const rows = new Map(); // id -> <tr>
  let next = null;
  let stopped = false;

  const render = (item) => h("tr", { "data-id": item.id, "data-status": item.status },
    kind.row(item).map((cell) => h("td", null, cell)));
  const describe = () => {
    count.textContent = `${rows.size}${next ? "+" : ""} ${which}, newest first`;
    more.hidden = !next;
    table.hidden = rows.size === 0;
    const empty = container.querySelector(".list-empty");
    if (rows.size === 0 && !empty) table.after(h("div", { class: "list-empty" }, emptyState(`No ${which} match these filters.`)));
    if (rows.size && empty) empty.remove();
  };
  const apiQuery = (cursor) => query({ ...filters, limit: PAGE, cursor });

  function add(items, { atTop = false } = {}) {
    const fresh = items.filter((item) => !rows.has(item.id)).map((item) => {
      const tr = render(item);
      rows.set(item.id, tr);
      return tr;
    });
    if (atTop) tbody.prepend(...fresh);
    else tbody.append(...fresh);
  }

  async function load(cursor) {
    try {
      const page = await api(`${kind.path}${apiQuery(cursor)}`);
      if (stopped) return;
      add(page.items);
      next = page.next;
      describe();
    } catch (error) {
      if (!stopped) message.textContent = error instanceof ApiError ? error.message : `Could not load the ${which}.`;
    }
  }

  // Live: re-read the rows whose executions changed; look for new ones at the top.
  const changed = new Set();
  let lookForNew = false;
  let scheduled = null;
  // At most one flush per 400 ms, however busy the stream (a debounce would starve under load).
  const schedule = () => {
    if (!scheduled) scheduled = setTimeout(() => { scheduled = null; flush(); }, 400);
  };
  async function flush() {
    const ids = [...changed].slice(0, REREAD_LIMIT);
    ids.forEach((id) => changed.delete(id));
    const newer = lookForNew;
    lookForNew = false;
    for (const id of ids) {
      try {
        const item = await kind.read(id);
        const old = rows.get(id);
        if (stopped || !old) continue;
        const tr = render(item);
        old.replaceWith(tr);
        rows.set(id, tr);
      } catch { /* gone or unreachable: the next event tries again */ }
    }
    if (newer && !stopped) {
      try {
        const page = await api(`${kind.path}${apiQuery(null)}`);
        if (!stopped) { add(page.items.filter((item) => !rows.has(item.id)), { atTop: true }); describe(); }
      } catch { /* the next event tries again */ }
    }
    if (changed.size && !stopped) schedule();
  }
  // A workflow's name looked up for the Workflow column of the jobs list.
  const unlisten = onJobInfo((id) => {
    for (const link of tbody.querySelectorAll(`a[data-workflow-name="${CSS.escape(id)}"]`)) {
      const name = workflowName(id);
      if (name) link.textContent = name;
    }
  });
  const unsubscribe = subscribe((event) => {
    const id = kind.owns(event);
    if (event.type === kind.created) lookForNew = true;
    else if (id && rows.has(id)) changed.add(id);
    else return;
    schedule();
  });

  function reload() { // after a bulk action: the rows as they are now
    rows.clear();
    tbody.replaceChildren();
    load(null);
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const wanted = Object.fromEntries(kind.filters.map((name) => [name, form.elements[name].value.trim()]));
    if (wanted.tag && !/^[^:\s]+:\S+$/.test(wanted.tag)) {
      message.textContent = "The tag filter is key:value";
      return;
    }
    location.hash = `${kind.route.slice(1)}${query(wanted)}`;
  });
  more.addEventListener("click", async () => {
    more.disabled = true;
    await load(next);
    more.disabled = false;
  });

  clear(container).append(h("section", { class: `view list-view ${which}` },
    h("div", { class: "toolbar" }, h("h1", null, kind.title),
      h("a", { class: "btn small", href: `#/new${which === "jobs" ? "" : "?form=workflow"}` }, which === "jobs" ? "Enqueue a job" : "Submit a workflow")),
    form, which === "jobs" ? bulkBar(filters, () => reload()) : null,
    message, count, table, h("div", { class: "more" }, more)));
  load(null);
  return () => { stopped = true; clearTimeout(scheduled); unsubscribe(); unlisten(); };
}
