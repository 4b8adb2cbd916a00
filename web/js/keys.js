// Keys: the concurrency and fairness keys, their limits set centrally (PUT /keys/{key}),
// the limit in force, the weight and rate, and how many of their jobs run; a form sets them.

import { api, ApiError } from "./api.js";
import { clear, dateTime, emptyState, h, toast } from "./dom.js";
import { pollRows } from "./polled.js";

const FIELDS = [
  ["concurrency_limit", "Concurrency limit", "jobs of this concurrency key at once; empty: each job's own", "int"],
  ["weight", "Weight", "turns of this fairness key per rotation", "int"],
  ["rate_per_second", "Rate per second", "starts per second over all queues; empty: none", "float"],
  ["burst", "Burst", "starts allowed at once after a quiet spell", "int"],
];

const shown = (value) => (value === null || value === undefined ? "—" : String(value));

function field(label, name, input, hint) {
  return h("label", { class: "form-field", "data-field": name },
    h("span", { class: "label" }, label), input, h("span", { class: "hint" }, hint),
    h("span", { class: "field-error", "data-for": name, "aria-live": "polite" }));
}

function keyForm(done) {
  const general = h("p", { class: "form-error", "aria-live": "polite" });
  const inputs = Object.fromEntries(FIELDS.map(([name]) => [name,
    h("input", { name, inputmode: "decimal", autocomplete: "off" })]));
  const key = h("input", { name: "key", required: true, autocomplete: "off" });
  const form = h("form", { class: "start-form card", id: "form-key", novalidate: true },
    h("h2", null, "Set a key's limits"),
    field("Key", "key", key, "a job's concurrency_key or fairness_key"),
    h("div", { class: "form-row" }, ...FIELDS.map(([name, label, hint]) => field(label, name, inputs[name], hint))),
    h("p", { class: "hint" }, "Fields left empty are left as they are; type none to clear a limit."),
    general,
    h("button", { class: "btn primary", type: "submit" }, "Save"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    for (const el of form.querySelectorAll(".field-error")) el.textContent = "";
    general.textContent = "";
    const body = {};
    for (const [name, , , kind] of FIELDS) {
      const text = inputs[name].value.trim();
      if (!text) continue;
      // "none" clears; anything else goes as typed (a number, or what the API refuses by name)
      body[name] = text.toLowerCase() === "none" ? null : (Number.isNaN(Number(text)) ? text : Number(text));
      if (kind === "int" && typeof body[name] === "number" && !Number.isInteger(body[name])) body[name] = text;
    }
    const name = key.value.trim();
    if (!name) {
      form.querySelector('.field-error[data-for="key"]').textContent = "a key is needed";
      return;
    }
    const button = form.querySelector("button[type=submit]");
    button.disabled = true;
    try {
      await api(`/keys/${encodeURIComponent(name)}`, { method: "PUT", body });
      toast(`Key ${name} saved.`, "ok");
      done();
    } catch (error) {
      const details = error instanceof ApiError && Array.isArray(error.body?.details) ? error.body.details : [];
      for (const detail of details) {
        const slot = form.querySelector(`.field-error[data-for="${CSS.escape(String(detail.field || ""))}"]`);
        if (slot) slot.textContent = detail.message ?? "";
      }
      general.textContent = error instanceof ApiError ? error.message : "The API did not answer.";
    } finally {
      button.disabled = false;
    }
  });
  return form;
}

export function mountKeys(container) {
  const body = h("tbody", { id: "key-rows" });
  const empty = emptyState("No keys yet. Jobs with a concurrency_key or fairness_key show up here, "
    + "and so does every key set with the form below (or PUT /keys/{key}).");
  const updated = h("span", { class: "muted small", "aria-live": "off" });
  function row(key) {
    return h("tr", { "data-key": key.key },
      h("th", { scope: "row" }, key.key,
        key.configured ? h("span", { class: "pill" }, "configured") : null),
      h("td", { class: "num limit" }, shown(key.concurrency_limit_in_force),
        key.concurrency_limit !== null ? h("span", { class: "muted small" }, " (set here)") : null),
      h("td", { class: "num weight" }, String(key.weight)),
      h("td", { class: "num rate" }, shown(key.rate_per_second)),
      h("td", { class: "num burst" }, shown(key.burst)),
      h("td", { class: "num running" }, String(key.running)),
      h("td", { class: "num claimed" }, String(key.fairness_claimed)),
      h("td", null, key.updated_at ? dateTime(key.updated_at) : "—"));
  }

  const rows = pollRows({
    path: "/keys?limit=500", name: "keys", body, empty, updated, key: (key) => key.key, build: row,
    changes: (event) => event.type === "KeyConfigured",
  });

  clear(container).append(h("section", { class: "view keys" },
    h("div", { class: "toolbar" }, h("h1", null, "Keys"), h("div", { class: "spacer" }), updated),
    h("div", { class: "card flush" }, h("div", { class: "table-wrap" }, h("table", { class: "list keys-table" },
      h("thead", null, h("tr", null, ["Key", "Concurrency limit", "Weight", "Rate/s", "Burst", "Running",
        "Claimed (fair)", "Set at"].map((label) => h("th", null, label)))),
      body)), empty),
    keyForm(rows.refresh)));

  return rows.dispose;
}
