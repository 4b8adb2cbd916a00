// "New": forms that start work. Each entry of START_FORMS is one form; running a stored
// definition, once the API has them, is one more entry here.
//
// Bad JSON is caught before anything is sent; the API's 422 details are shown next to the
// field they name (the first segment of `field`), the rest above the buttons.

import { api, ApiError } from "./api.js";
import { clear, h, toast } from "./dom.js";
import { STEP_TYPES } from "./states.js";

const TAG_PATTERN = /^[^:\s]+:\S+$/;

const EXAMPLE_WORKFLOW = {
  name: "example",
  tags: { team: "data" },
  steps: [
    { step: "extract", task: "echo", payload: { rows: 3 } },
    { step: "transform", task: "add", payload: { a: 1, b: 2 }, depends_on: ["extract"] },
    { step: "load", task: "echo", depends_on: ["transform"] },
  ],
};

// The tasks every worker has (qforge.workers.tasks and its executors), with what they take;
// tests/browser/test_truth.py holds this list to the registry.
const BUILT_IN_TASKS = [
  ["echo", "returns its payload"], ["add", "{a, b}: their sum"], ["slow", "{seconds}: sleeps"],
  ["fail", "{message}: always fails"], ["flaky", "{fail_times}: fails that many attempts"],
  ["shell", "{command}: a worker started with --allow-shell"], ["http", "{url, method?, ...}: an HTTP call"],
];

// What each step type does (the list itself is the API's: states.js STEP_TYPES).
const STEP_HELP = {
  task: "runs its task (the default)", wait_for_trigger: "waits for POST /workflows/{id}/steps/{step}/trigger",
  sleep: "waits its seconds without holding a worker", workflow: "runs a stored definition (definition, inputs) as a sub-workflow",
};

function field(label, name, input, hint) {
  return h("label", { class: "form-field", "data-field": name },
    h("span", { class: "label" }, label), input,
    hint ? h("span", { class: "hint" }, hint) : null,
    h("span", { class: "field-error", "data-for": name, "aria-live": "polite" }));
}

/** Shows errors next to their fields; returns false when any was shown. */
function showErrors(form, general, problems) {
  for (const el of form.querySelectorAll(".field-error")) el.textContent = "";
  general.textContent = "";
  for (const { field: name, message } of problems) {
    const top = String(name || "").split(/[.[]/)[0];
    const slot = form.querySelector(`.field-error[data-for="${CSS.escape(top)}"]`)
      || form.querySelector(".field-error[data-catch-all]");
    const text = name && !slot?.dataset.for?.startsWith(name) ? `${name}: ${message}` : message;
    if (slot) slot.textContent = slot.textContent ? `${slot.textContent}; ${text}` : text;
    else general.textContent = general.textContent ? `${general.textContent}; ${text}` : text;
  }
  return problems.length === 0;
}

function parseJson(text, name, problems) {
  if (!text.trim()) return undefined;
  try {
    return JSON.parse(text);
  } catch (error) {
    problems.push({ field: name, message: `not valid JSON (${error.message})` });
    return undefined;
  }
}

async function send(form, general, path, body, done) {
  const button = form.querySelector("button[type=submit]");
  button.disabled = true;
  try {
    const created = await api(path, { method: "POST", body });
    showErrors(form, general, []);
    done(created);
  } catch (error) {
    if (error instanceof ApiError && Array.isArray(error.body?.details) && error.body.details.length) {
      showErrors(form, general, error.body.details.map((d) => (typeof d === "string"
        ? { field: "", message: d } : { field: d.field, message: d.message ?? JSON.stringify(d) })));
    } else {
      showErrors(form, general, []);
      general.textContent = error instanceof ApiError ? error.message : "The API did not answer.";
    }
  } finally {
    button.disabled = false;
  }
}

function jobForm() {
  const payload = h("textarea", { name: "payload", rows: 5, spellcheck: "false" }, '{"a": 2, "b": 3}');
  const form = h("form", { class: "start-form card", id: "form-job", novalidate: true },
    h("h2", null, "Enqueue a job"),
    field("Task", "task", h("input", { name: "task", value: "add", required: true, autocomplete: "off", list: "builtin-tasks" }),
      h("span", { id: "task-hint" }, "Built in: ", BUILT_IN_TASKS.map(([name, what], index) =>
        [index ? "; " : "", h("code", null, name), ` ${what}`]), "; or any task your workers register.")),
    h("datalist", { id: "builtin-tasks" }, BUILT_IN_TASKS.map(([name]) => h("option", { value: name }))),
    field("Payload (JSON object)", "payload", payload),
    h("div", { class: "form-row" },
      field("Queue", "queue", h("input", { name: "queue", placeholder: "default", autocomplete: "off" })),
      field("Priority", "priority", h("input", { name: "priority", placeholder: "0", inputmode: "numeric" })),
      field("Max retries", "max_retries", h("input", { name: "max_retries", placeholder: "3", inputmode: "numeric" })),
      field("Delay (s)", "delay_seconds", h("input", { name: "delay_seconds", placeholder: "0", inputmode: "decimal" }))),
    field("Tags", "tags", h("input", { name: "tags", placeholder: "order:A-1 region:eu", autocomplete: "off" })),
    field("Idempotency key", "idempotency_key", h("input", { name: "idempotency_key", autocomplete: "off" })));
  const general = h("p", { class: "form-message", "aria-live": "polite" });
  form.append(general, h("div", { class: "actions" }, h("button", { class: "btn primary", type: "submit" }, "Enqueue")));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const values = Object.fromEntries(new FormData(form).entries());
    const problems = [];
    const body = { task: values.task.trim() };
    const parsed = parseJson(values.payload, "payload", problems);
    if (parsed !== undefined) body.payload = parsed;
    // Numbers go as typed: the API names what is wrong with them.
    for (const name of ["queue", "priority", "max_retries", "delay_seconds", "idempotency_key"]) {
      const value = values[name].trim();
      if (!value) continue;
      body[name] = ["queue", "idempotency_key"].includes(name) || Number.isNaN(Number(value)) ? value : Number(value);
    }
    const tags = values.tags.split(/\s+/).filter(Boolean);
    const badTags = tags.filter((tag) => !TAG_PATTERN.test(tag));
    if (badTags.length) problems.push({ field: "tags", message: `not key:value: ${badTags.join(", ")}` });
    if (tags.length) body.tags = Object.fromEntries(tags.map((tag) => [tag.slice(0, tag.indexOf(":")), tag.slice(tag.indexOf(":") + 1)]));
    if (!showErrors(form, general, problems)) return;
    send(form, general, "/jobs", body, (job) => {
      toast(`Enqueued ${job.task}`);
      location.hash = `#/jobs/${job.id}`;
    });
  });
  return form;
}

function workflowForm() {
  const text = h("textarea", { name: "body", rows: 16, spellcheck: "false" }, JSON.stringify(EXAMPLE_WORKFLOW, null, 2));
  const form = h("form", { class: "start-form card", id: "form-workflow", novalidate: true },
    h("h2", null, "Submit a workflow"),
    h("div", { class: "muted", id: "workflow-help" },
      h("p", null, "The body of POST /workflows: a name, tags, and steps with depends_on, when, on_failure and a type:"),
      h("ul", { class: "step-types" },
        STEP_TYPES.map((type) => h("li", null, h("code", null, type), ` ${STEP_HELP[type] ?? ""}`)),
        h("li", null, h("code", null, "for_each"),
          " (a field of a task step, {\"step\", \"path\"?}): runs it once per element of that step's output, max_parallel at once"))));
  const body = field("Workflow (JSON)", "body", text);
  body.querySelector(".field-error").dataset.catchAll = "";
  const general = h("p", { class: "form-message", "aria-live": "polite" });
  form.append(body, general, h("div", { class: "actions" }, h("button", { class: "btn primary", type: "submit" }, "Submit")));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const problems = [];
    const parsed = parseJson(text.value, "body", problems);
    if (parsed === undefined && !problems.length) problems.push({ field: "body", message: "the workflow is empty" });
    if (!showErrors(form, general, problems)) return;
    send(form, general, "/workflows", parsed, (workflow) => {
      toast(`Submitted ${workflow.name}`);
      location.hash = `#/workflows/${workflow.id}`;
    });
  });
  return form;
}

// [id, tab label, build()]. A stored definition's "Run" form is one more entry.
export const START_FORMS = [
  ["job", "Job", jobForm],
  ["workflow", "Workflow", workflowForm],
];

export function mountNew(container, params) {
  const chosen = START_FORMS.find(([id]) => id === params.get("form")) || START_FORMS[0];
  const tabs = h("div", { class: "tabs", role: "tablist" }, START_FORMS.map(([id, label]) =>
    h("a", { class: `btn small${id === chosen[0] ? " primary" : ""}`, href: `#/new?form=${id}`, role: "tab",
      "aria-selected": String(id === chosen[0]) }, label)));
  clear(container).append(h("section", { class: "view new" },
    h("div", { class: "toolbar" }, h("h1", null, "Start something"), tabs),
    chosen[2]()));
}
