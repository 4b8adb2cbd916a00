// Search by tag: "order_id:A-1001 region:eu" -> every job and workflow carrying all of them.

import { api, ApiError, query } from "./api.js";
import {
  clear, dateTime, emptyState, h, jobLink, pill, tagChips, workflowLink,
} from "./dom.js";
import { workflowName } from "./live.js";

const TAG_PATTERN = /^[^:\s]+:\S+$/;

function kindOf(item) {
  const declared = item.kind ?? item.execution_type ?? item.stream_type ?? item.type;
  if (declared === "job" || declared === "workflow") return declared;
  return Array.isArray(item.steps) || ("name" in item && !("task" in item)) ? "workflow" : "job";
}

/** [{kind, ...item}] from either {jobs, workflows} or {items}. */
function executionsOf(body) {
  if (!body || typeof body !== "object") return [];
  const out = [];
  if (Array.isArray(body.jobs) || Array.isArray(body.workflows)) {
    for (const job of body.jobs || []) out.push({ ...job, kind: "job" });
    for (const workflow of body.workflows || []) out.push({ ...workflow, kind: "workflow" });
  }
  for (const item of Array.isArray(body) ? body : body.items || []) {
    out.push({ ...item, kind: kindOf(item) });
  }
  return out;
}

/** Rows for the results: workflows first, each with its steps grouped under it (collapsed
 * behind a "N steps" button), then the jobs that are not steps of a listed workflow. */
function resultRows(items) {
  const workflows = items.filter((item) => item.kind === "workflow");
  const listed = new Set(workflows.map((workflow) => workflow.id));
  const stepsOf = new Map(workflows.map((workflow) => [workflow.id, []]));
  const jobs = [];
  for (const item of items) {
    if (item.kind === "workflow") continue;
    if (item.workflow_id && listed.has(item.workflow_id)) stepsOf.get(item.workflow_id).push(item);
    else jobs.push(item);
  }
  const rows = [];
  for (const workflow of workflows) {
    const steps = stepsOf.get(workflow.id);
    const stepRows = steps.map((step) => {
      const row = resultRow(step);
      row.classList.add("step-of");
      row.dataset.parent = workflow.id;
      row.hidden = true;
      return row;
    });
    const toggle = steps.length ? h("button", {
      class: "btn small steps-toggle", type: "button", "aria-expanded": "false",
      onclick: (event) => {
        const open = event.currentTarget.getAttribute("aria-expanded") !== "true";
        event.currentTarget.setAttribute("aria-expanded", String(open));
        event.currentTarget.textContent = `${open ? "▾" : "▸"} ${steps.length} step${steps.length === 1 ? "" : "s"}`;
        for (const row of stepRows) row.hidden = !open;
      },
    }, `▸ ${steps.length} step${steps.length === 1 ? "" : "s"}`) : null;
    rows.push(resultRow(workflow, toggle), ...stepRows);
  }
  return [...rows, ...jobs.map((job) => resultRow(job))];
}

function resultRow(item, toggle = null) {
  const isWorkflow = item.kind === "workflow";
  const link = isWorkflow ? workflowLink(item.id) : jobLink(item.id);
  let what = isWorkflow ? item.name : item.task;
  if (!isWorkflow && item.step) what = `${item.step} (${item.task})`;
  return h("tr", { class: "result", "data-kind": item.kind, "data-id": item.id },
    h("td", null, h("span", { class: `kind kind-${item.kind}` }, item.kind)),
    h("td", null, link),
    h("td", { class: "what" }, what ?? "—", toggle ? [" ", toggle] : null),
    h("td", null, pill(item.status)),
    h("td", null, isWorkflow ? "—" : (item.queue ?? "—")),
    h("td", { class: "tagcell" }, tagChips(item.tags)),
    h("td", null, dateTime(item.created_at)),
    h("td", null, isWorkflow
      ? null
      : (item.workflow_id ? workflowLink(item.workflow_id, workflowName(item.workflow_id) ?? "workflow") : null)));
}

export function mountSearch(container, params) {
  const initial = params.getAll("tag").join(" ");
  const input = h("input", {
    id: "tag-search", name: "tags", value: initial, placeholder: "order_id:A-1001 customer:acme",
    autocomplete: "off", spellcheck: "false", "aria-label": "Tags",
  });
  // Who: a token's name (the actor of the events its requests wrote), a worker, the monitor.
  const actorInput = h("input", {
    id: "actor-search", name: "actor", value: params.get("actor") ?? "", placeholder: "by (token name)",
    autocomplete: "off", spellcheck: "false", "aria-label": "Actor",
  });
  const message = h("p", { class: "form-message", "aria-live": "polite" });
  const results = h("div", { id: "search-results" });
  const form = h("form", { class: "search-form" },
    input, actorInput, h("button", { class: "btn primary", type: "submit" }, "Search"));
  const actorOf = () => actorInput.value.trim() || undefined;
  let generation = 0;

  async function run(tags) {
    const mine = ++generation;
    message.textContent = "";
    if (!tags.length) {
      clear(results).append(emptyState(
        "Type one or more tags as key:value, separated by spaces. Every result carries all of them."));
      return;
    }
    results.setAttribute("aria-busy", "true");
    try {
      const body = await api(`/executions${query({ tag: tags, actor: actorOf() })}`);
      if (mine !== generation) return;
      const items = executionsOf(body);
      clear(results);
      if (!items.length) {
        results.append(emptyState(`No job or workflow carries ${tags.join(" and ")}.`));
        return;
      }
      const all = [...items];
      let shown = items.length;
      let next = body && body.next;
      const count = h("p", { class: "muted" });
      const tbody = h("tbody", null, resultRows(all));
      const more = h("button", { class: "btn", type: "button", id: "search-more" }, "Show more");
      const describe = () => {
        const flows = all.filter((item) => item.kind === "workflow").length;
        count.textContent = `${shown}${next ? "+" : ""} execution${shown === 1 ? "" : "s"} with ${tags.join(" ")}`
          + ` (${flows} workflow${flows === 1 ? "" : "s"}, ${shown - flows} job${shown - flows === 1 ? "" : "s"})`
          + `${actorOf() ? ` touched by ${actorOf()}` : ""}; workflows first, each kind newest first`;
        more.hidden = !next;
      };
      more.addEventListener("click", async () => {
        more.disabled = true;
        try {
          const page = await api(`/executions${query({ tag: tags, actor: actorOf(), cursor: next })}`);
          if (mine !== generation) return;
          const extra = executionsOf(page);
          all.push(...extra);
          tbody.replaceChildren(...resultRows(all)); // a later page's steps join their workflow
          shown += extra.length;
          next = page && page.next;
          describe();
        } catch (error) {
          message.textContent = error instanceof ApiError ? error.message : "Could not load more.";
        } finally {
          more.disabled = false;
        }
      });
      describe();
      results.append(count,
        h("div", { class: "table-wrap" }, h("table", { class: "list" },
          h("thead", null, h("tr", null, ["Kind", "Id", "Name / task", "Status", "Queue", "Tags",
            "Created", ""].map((label) => h("th", null, label)))),
          tbody)),
        h("div", { class: "more" }, more));
    } catch (error) {
      if (mine !== generation) return;
      clear(results);
      message.textContent = error instanceof ApiError ? error.message : "The search failed; is the API up?";
    } finally {
      results.removeAttribute("aria-busy");
    }
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const tags = input.value.split(/\s+/).filter(Boolean);
    const bad = tags.filter((tag) => !TAG_PATTERN.test(tag));
    if (bad.length) {
      message.textContent = `Not a key:value tag: ${bad.join(", ")}`;
      return;
    }
    history.replaceState(null, "", `#/search${query({ tag: tags, actor: actorOf() })}`);
    run(tags);
  });

  clear(container).append(h("section", { class: "view search" },
    h("div", { class: "toolbar" }, h("h1", null, "Search by tag")),
    form, message, results));
  input.focus();
  run(initial.split(/\s+/).filter(Boolean));
  return () => { generation += 1; };
}
