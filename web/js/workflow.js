// Workflow detail: the DAG, live; a step's output, error and attempts on click; trigger and cancel.

import { api, ApiError } from "./api.js";
import {
  between, clear, codeBlock, dateTime, debounce, emptyState, facts, h, jobLink, oneAtATime, pill,
  RESUMABLE, STATUSES, statusClass, tagChips, toast, workflowLink, S,
} from "./dom.js";
import { auditStatus } from "./audit.js";
import { crumbs } from "./crumbs.js";
import { chooseLayout, isTriggerable, renderDag } from "./dag.js";
import { detailView, heartbeatToggle, historyList, keepOpenDetails, notLoaded, visibleHistory } from "./job.js";
import { subscribe } from "./live.js";
import { describeCondition } from "./summary.js";

const FALLBACK_REFRESH_MS = 5000;
const DEFINITION_FIELDS = ["type", "task", "when", "on_failure", "depends_on", "seconds", "timeout_seconds",
  "definition", "for_each", "max_parallel"];

/** A fan-out step's elements: counts by status, then each element (its job), expandable. */
function elementsList(elements) {
  const counts = Object.entries(elements.counts || {}).map(([status, n]) => h("span", null, pill(status), ` ${n}`));
  const rows = (elements.items || []).map((item) => h("li", null,
    `#${item.index} `, pill(item.status), " ", jobLink(item.job_id),
    item.attempts > 1 ? ` ×${item.attempts}` : "", item.error ? h("span", { class: "muted" }, ` ${item.error}`) : null));
  return h("details", { class: "elements", id: "step-elements", open: elements.total <= 20 ? "" : null },
    h("summary", null, `${elements.total} elements `, ...counts),
    h("ol", { class: "element-list" }, rows));
}

/** GET /workflows/{id} steps, completed with the submitted definitions when a field is missing. */
function mergeDefinitions(steps, history) {
  const submitted = history.find((event) => event.type === "WorkflowSubmitted");
  const definitions = new Map(((submitted && submitted.data && submitted.data.steps) || [])
    .map((definition) => [definition.step, definition]));
  return steps.map((step) => {
    const definition = definitions.get(step.step) || {};
    const merged = { ...step };
    for (const field of DEFINITION_FIELDS) {
      if (merged[field] == null && definition[field] != null) merged[field] = definition[field];
    }
    return merged;
  });
}

function statusCounts(steps) {
  const counts = new Map();
  for (const step of steps) counts.set(step.status, (counts.get(step.status) || 0) + 1);
  return h("div", { class: "counts" }, STATUSES.filter((status) => counts.has(status)).map((status) =>
    h("span", { class: `count-chip ${statusClass(status)}` },
      h("span", { class: "swatch" }), `${counts.get(status)} ${status}`)));
}

function legend() {
  return h("div", { class: "legend", "aria-label": "Legend" },
    STATUSES.map((status) => h("span", { class: `legend-item ${statusClass(status)}` },
      h("span", { class: "swatch" }), status)),
    h("span", { class: "legend-item edge-key" }, h("span", { class: "line dep" }), "depends on"),
    h("span", { class: "legend-item edge-key" }, h("span", { class: "line when" }), "runs only when"),
    h("span", { class: "legend-item edge-key" }, h("span", { class: "line failure" }), "on failure"));
}

export function mountWorkflow(container, workflowId) {
  const root = detailView(container, "workflow", workflowId);
  let disposed = false;
  const audit = auditStatus("workflow", workflowId);
  let selected = null;
  let dag = null;
  let workflow = null;
  let steps = [];
  let panel = null;
  let header = null;
  let historyHost = null;
  let historyHeading = null;

  const stepUrl = (step) => `/workflows/${encodeURIComponent(workflowId)}/steps/${encodeURIComponent(step)}`;

  /** POST a workflow command (cancel, resume), say how it went, and reload. */
  async function workflowCommand(command, done, failed) {
    try {
      await api(`/workflows/${encodeURIComponent(workflowId)}/${command}`, { method: "POST" });
      toast(done, "ok");
    } catch (error) {
      toast(error instanceof ApiError ? error.message : failed, "error");
    }
    load();
  }

  const cancelWorkflow = () => workflowCommand("cancel", "Workflow cancelled.", "Could not cancel the workflow.");
  const resumeWorkflow = () => workflowCommand("resume", "Workflow resumed: its failed steps run again.",
    "Could not resume the workflow.");

  async function trigger(step, textarea, message) {
    let payload;
    try {
      payload = textarea.value.trim() ? JSON.parse(textarea.value) : {};
    } catch (error) {
      message.textContent = `Not valid JSON: ${error.message}`;
      return;
    }
    if (payload === null || typeof payload !== "object" || Array.isArray(payload)) {
      message.textContent = "The payload must be a JSON object, e.g. {\"approved\": true}.";
      return;
    }
    message.textContent = "";
    try {
      await api(`${stepUrl(step)}/trigger`, { method: "POST", body: { payload } });
      toast(`Step ${step} triggered.`, "ok");
    } catch (error) {
      message.textContent = error instanceof ApiError ? error.message : "The trigger failed.";
    }
    load();
  }

  function renderPanel() {
    const step = steps.find((candidate) => candidate.step === selected);
    // Keep what the reader typed into the trigger payload across live updates.
    const oldTextarea = panel.querySelector("textarea");
    const typed = oldTextarea ? oldTextarea.value : null;
    const hadFocus = oldTextarea && document.activeElement === oldTextarea;
    clear(panel);
    if (!step) {
      panel.append(h("h2", null, "Steps"),
        h("p", { class: "muted" }, "Click a step to see its output, error, attempts and times."));
      const waiting = steps.filter(isTriggerable);
      if (waiting.length) {
        panel.append(h("p", null, "Waiting for a trigger: "),
          h("ul", { class: "plain" }, waiting.map((w) => h("li", null,
            h("button", { class: "btn small", type: "button", onclick: () => choose(w.step) }, w.step)))));
      }
      return;
    }
    const when = step.when ? describeCondition(step.when) : null;
    panel.append(
      h("div", { class: "panel-head" }, h("h2", null, step.step), pill(step.status),
        h("button", {
          class: "close", type: "button", title: "Close", "aria-label": "Close the step panel",
          onclick: () => choose(null),
        }, "×")),
      facts([
        ["Type", step.type || "task"],
        step.task && (step.type || "task") === "task" ? ["Task", step.task] : null,
        ["Job", step.job_id ? jobLink(step.job_id) : null],
        ["Attempts", String(step.attempts ?? 0)],
        ["Started", dateTime(step.started_at)],
        ["Finished", dateTime(step.finished_at)],
        ["Took", step.started_at && step.finished_at ? between(step.started_at, step.finished_at) : null],
        ["Depends on", (step.depends_on || []).length ? step.depends_on.join(", ") : null],
        when ? ["Runs when", when] : null,
        step.on_failure ? ["On failure", step.on_failure] : null,
        step.child_workflow_id ? ["Sub-workflow", workflowLink(step.child_workflow_id)] : null,
      ]));
    if (step.elements) panel.append(elementsList(step.elements));
    if (isTriggerable(step)) {
      const textarea = h("textarea", {
        id: "trigger-payload", rows: 4, spellcheck: "false", "aria-label": "Trigger payload (JSON)",
      });
      textarea.value = typed ?? "{}";
      const message = h("p", { class: "form-message", "aria-live": "polite" });
      const form = h("form", { class: "trigger-form" },
        h("label", { for: "trigger-payload" }, "Payload (JSON object), becomes the step's output"),
        textarea, message,
        h("button", { class: "btn primary", id: "trigger-button", type: "submit" }, `Trigger ${step.step}`));
      form.addEventListener("submit", (event) => {
        event.preventDefault();
        trigger(step.step, textarea, message);
      });
      panel.append(form);
      if (hadFocus) textarea.focus();
    }
    if (step.input != null) panel.append(h("h3", null, "Input"), codeBlock(step.input));
    if (step.error != null && step.error !== "") {
      panel.append(h("h3", null, "Error"), codeBlock(step.error, "error"));
    }
    if (step.output !== undefined && step.output !== null) {
      panel.append(h("h3", null, "Output"), codeBlock(step.output));
    } else if (!step.error) {
      panel.append(h("p", { class: "muted" }, "No output yet."));
    }
  }

  function dagWidth() {
    const card = root.querySelector("#dag-card");
    return card ? card.clientWidth - 18 : 0;
  }

  /** Draw the graph when its shape (or the best direction) changed; otherwise recolour it. */
  function drawDag({ resized = false } = {}) {
    const card = root.querySelector("#dag-card");
    if (!card) return;
    const direction = chooseLayout(steps, dagWidth()).direction;
    if (!dag || !dag.sameShape(steps) || dag.direction !== direction) {
      dag = renderDag(steps, { onSelect: choose, selected, available: dagWidth() });
      clear(card).append(steps.length ? dag.svg : emptyState("This workflow has no steps."));
      dag.fitLabels();
    } else if (!resized) {
      dag.update(steps);
    }
    dag.fitWidth(dagWidth());
  }

  function choose(step) {
    selected = step;
    if (dag) dag.select(selected);
    renderPanel();
  }

  function renderHeader() {
    const actions = [h("a", { class: "btn", href: `#/timeline?workflow=${encodeURIComponent(workflowId)}` },
      "Events in timeline")];
    if (workflow.status === S.RUNNING) {
      actions.push(h("button", { class: "btn danger", id: "workflow-cancel", type: "button", onclick: cancelWorkflow },
        "Cancel workflow"));
    }
    if (RESUMABLE.has(workflow.status)) {
      actions.push(h("button", { class: "btn primary", id: "workflow-resume", type: "button", onclick: resumeWorkflow },
        "Resume"));
    }
    clear(header).append(
      h("div", null,
        h("h1", null, h("span", null, workflow.name ?? "workflow"), " ",
          h("span", { id: "workflow-status" }, pill(workflow.status))),
        h("code", { class: "fullid" }, workflow.id),
        audit.el,
        h("div", { class: "meta" },
          h("span", null, "created ", dateTime(workflow.created_at)),
          workflow.finished_at ? h("span", null, "finished ", dateTime(workflow.finished_at),
            ` (${between(workflow.created_at, workflow.finished_at)})`) : null,
          Object.keys(workflow.tags || {}).length ? tagChips(workflow.tags) : null,
          workflow.parent ? h("span", { id: "workflow-parent" }, "sub-workflow of ",
            workflowLink(workflow.parent.workflow_id), ` (step ${workflow.parent.step})`) : null,
          workflow.definition ? h("span", null,
            `definition ${workflow.definition.name} v${workflow.definition.version}`) : null,
          workflow.code ? h("span", { id: "workflow-code" }, `code ${workflow.code}`) : null),
        statusCounts(steps),
        workflow.outcome ? h("p", {
          id: "workflow-outcome",
          class: `outcome${workflow.status === S.SUCCEEDED && steps.some((step) => step.status === S.DEAD) ? " handled" : ""}`,
        }, h("strong", null, "Why: "), workflow.outcome) : null),
      h("div", { class: "actions" }, actions));
  }

  function render(history) {
    if (!header) {
      header = h("header", { class: "detail-header" });
      panel = h("aside", { class: "card step-panel", id: "step-panel" });
      historyHost = h("div");
      clear(root).append(
        crumbs("workflow", { fallback: "workflows" }),
        header,
        h("div", { class: "wf-body" }, h("div", { class: "card dag-card", id: "dag-card" }), panel),
        legend(),
        historyHeading = h("h2", null, "History "),
        historyHost);
    }
    historyHeading.replaceChildren("History ", heartbeatToggle(history, () => render(history)));
    renderHeader();
    drawDag();
    renderPanel();
    const stepByJob = new Map(steps.map((step) => [step.job_id, step.step]));
    keepOpenDetails(historyHost, () => clear(historyHost).append(historyList(
      visibleHistory(history),
      { stepOf: (event) => stepByJob.get(event.stream_id), label: "Workflow history" })));
  }

  // One load at a time; a change seen during a load triggers one more after it.
  const load = oneAtATime(async () => {
    try {
      const [body, events] = await Promise.all([
        api(`/workflows/${encodeURIComponent(workflowId)}`),
        api(`/workflows/${encodeURIComponent(workflowId)}/events`),
      ]);
      if (disposed) return;
      const history = (events && events.events) || [];
      workflow = body;
      steps = mergeDefinitions(body.steps || [], history);
      if (selected === null && !header) selected = (steps.find(isTriggerable) || {}).step ?? null;
      render(history);
    } catch (error) {
      if (disposed) return;
      header = null;
      dag = null;
      clear(root).append(...notLoaded("workflow", workflowId, error));
    }
  }, () => disposed);

  const refresh = debounce(load, 100);
  const unsubscribe = subscribe((event) => {
    if (event.type === "Heartbeat") return;
    if (event.workflow_id === workflowId || event.stream_id === workflowId) refresh();
  });
  const timer = setInterval(load, FALLBACK_REFRESH_MS);
  const onResize = debounce(() => drawDag({ resized: true }), 100);
  window.addEventListener("resize", onResize);
  load();
  return () => {
    disposed = true;
    window.removeEventListener("resize", onResize);
    refresh.cancel();
    clearInterval(timer);
    audit.dispose();
    unsubscribe();
  };
}
