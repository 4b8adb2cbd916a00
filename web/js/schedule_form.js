// The form that creates a schedule (POST /schedules): a name, a cron line and its time zone,
// and what each tick starts: a job (task, queue, payload) or a stored definition (a pinned
// version or the latest, its inputs). The API's refusal is shown as it names the field.

import { api, ApiError, itemsOf } from "./api.js";
import { h, toast } from "./dom.js";

function parseObject(text, field) {
  if (!text.trim()) return {};
  const value = JSON.parse(text);
  if (!value || typeof value !== "object" || Array.isArray(value)) throw new Error(`${field}: a JSON object`);
  return value;
}

export function scheduleForm(onCreated) {
  const field = (label, input) => h("label", null, label, input);
  const name = h("input", { name: "name", id: "schedule-name", required: true, placeholder: "nightly-report" });
  const cron = h("input", { name: "cron", id: "schedule-cron", required: true, placeholder: "0 3 * * *" });
  const timezone = h("input", { name: "timezone", id: "schedule-timezone", value: "UTC" });
  const kind = h("select", { name: "kind", id: "schedule-kind" },
    h("option", { value: "job" }, "a job"), h("option", { value: "definition" }, "a stored definition"));
  const task = h("input", { name: "task", id: "schedule-task", placeholder: "echo" });
  const queue = h("input", { name: "queue", id: "schedule-queue", placeholder: "default" });
  const payload = h("textarea", { name: "payload", id: "schedule-payload", rows: 2, placeholder: "{}" });
  const definition = h("select", { name: "definition", id: "schedule-definition" });
  const version = h("select", { name: "version", id: "schedule-version" });
  const inputs = h("textarea", { name: "inputs", id: "schedule-inputs", rows: 2, placeholder: "{}" });
  const message = h("p", { class: "form-message", id: "schedule-message", "aria-live": "polite" });
  const jobPart = h("div", { class: "stack-form" }, field("Task", task), field("Queue", queue),
    field("Payload (JSON)", payload));
  const definitionPart = h("div", { class: "stack-form", hidden: true }, field("Definition", definition),
    field("Version", version), field("Inputs (JSON)", inputs));
  const form = h("form", { class: "card stack-form", id: "schedule-form" },
    h("h2", null, "New schedule"), field("Name", name), field("Cron (5 fields, or 6 with seconds first)", cron),
    field("Time zone", timezone), field("Each tick starts", kind), jobPart, definitionPart, message,
    h("div", null, h("button", { class: "btn primary", type: "submit", id: "schedule-create" }, "Create schedule")));

  let asked = 0; // the newest question: an older answer arriving late is dropped
  async function versions() {
    const mine = ++asked;
    const options = [h("option", { value: "" }, "the latest, whichever it is")];
    if (definition.value) {
      const found = await api(`/definitions/${encodeURIComponent(definition.value)}`);
      for (let n = found.latest_version; n >= 1; n -= 1) options.push(h("option", { value: String(n) }, `version ${n}`));
    }
    if (mine === asked) version.replaceChildren(...options);
  }
  kind.addEventListener("change", async () => {
    jobPart.hidden = kind.value !== "job";
    definitionPart.hidden = kind.value !== "definition";
    if (kind.value === "definition" && !definition.options.length) {
      const names = itemsOf(await api("/definitions?limit=500")).map((d) => d.name);
      definition.replaceChildren(...names.map((n) => h("option", { value: n }, n)));
      await versions();
    }
  });
  definition.addEventListener("change", versions);
  form.addEventListener("input", () => { message.textContent = ""; });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    message.textContent = "";
    let body;
    try {
      body = { name: name.value.trim(), cron: cron.value.trim(), timezone: timezone.value.trim() || "UTC" };
      if (kind.value === "job") {
        body.job = { task: task.value.trim(), payload: parseObject(payload.value, "payload") };
        if (queue.value.trim()) body.job.queue = queue.value.trim();
      } else {
        body.definition = definition.value;
        if (version.value) body.version = Number(version.value);
        const given = parseObject(inputs.value, "inputs");
        if (Object.keys(given).length) body.inputs = given;
      }
    } catch (error) {
      message.textContent = error.message;
      return;
    }
    try {
      const made = await api("/schedules", { method: "POST", body });
      toast(`Schedule ${made.name} created.`, "ok");
      form.reset();
      onCreated();
    } catch (error) {
      message.textContent = error instanceof ApiError ? error.message : "Could not create the schedule.";
    }
  });
  return form;
}
