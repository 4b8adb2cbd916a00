// Stored definitions: the list (each name's latest version), and one definition's page: its
// versions, a line diff between any two, and a form that runs it (inputs, a version picker).

import { api, ApiError, itemsOf } from "./api.js";
import { clear, dateTime, emptyState, h, toast } from "./dom.js";

const link = (name) => h("a", { href: `#/definitions/${encodeURIComponent(name)}` }, name);

export function mountDefinitions(container) {
  const body = h("tbody", { id: "definition-rows" });
  clear(container).append(h("section", { class: "view definitions" },
    h("div", { class: "toolbar" }, h("h1", null, "Definitions")),
    h("div", { class: "table-wrap" }, h("table", { class: "list" },
      h("thead", null, h("tr", null, ["Name", "Latest version", "Steps", "Updated"].map((t) => h("th", null, t)))),
      body))));
  api("/definitions?limit=500").then((page) => {
    const items = itemsOf(page);
    if (!items.length) body.closest(".table-wrap").after(emptyState("No definitions yet: PUT /definitions/{name} stores one."));
    body.replaceChildren(...items.map((d) => h("tr", { "data-definition": d.name },
      h("td", null, link(d.name)), h("td", { class: "num" }, String(d.version)),
      h("td", { class: "num" }, String((d.document.steps || []).length)), h("td", null, dateTime(d.updated_at)))));
  }).catch((error) => toast(error instanceof ApiError ? error.message : "Could not load the definitions.", "error"));
}

/** Lines of `a` and `b` marked same / del / add, by their longest common subsequence. */
export function lineDiff(a, b) {
  const n = a.length, m = b.length;
  const common = Array.from({ length: n + 1 }, () => new Array(m + 1).fill(0));
  for (let i = n - 1; i >= 0; i -= 1) {
    for (let j = m - 1; j >= 0; j -= 1) {
      common[i][j] = a[i] === b[j] ? common[i + 1][j + 1] + 1 : Math.max(common[i + 1][j], common[i][j + 1]);
    }
  }
  const out = [];
  let i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && a[i] === b[j]) { out.push(["same", a[i]]); i += 1; j += 1; }
    else if (j < m && (i === n || common[i][j + 1] >= common[i + 1][j])) { out.push(["add", b[j]]); j += 1; }
    else { out.push(["del", a[i]]); i += 1; }
  }
  return out;
}

const lines = (document) => JSON.stringify(document, Object.keys(flatKeys(document)).sort(), 2).split("\n");

function flatKeys(value, keys = {}) { // every key at any depth: a stable order for the diff
  if (value && typeof value === "object") {
    for (const [key, item] of Object.entries(value)) { if (!Array.isArray(value)) keys[key] = true; flatKeys(item, keys); }
  }
  return keys;
}

export function mountDefinition(container, name) {
  const versionPicker = (id) => h("select", { id, name: id });
  const older = versionPicker("diff-old");
  const newer = versionPicker("diff-new");
  const runVersion = versionPicker("run-version");
  const diff = h("div", { class: "diff", id: "definition-diff", role: "region", "aria-label": "Diff" });
  const current = h("pre", { class: "code", id: "definition-document" });
  const inputs = h("textarea", { id: "run-inputs", rows: 4, spellcheck: "false" }, "{}");
  const message = h("p", { class: "form-message", id: "run-message", "aria-live": "polite" });
  const versions = h("tbody", { id: "version-rows" });
  const cache = new Map();
  const get = async (version) => {
    if (!cache.has(version)) cache.set(version, await api(`/definitions/${encodeURIComponent(name)}?version=${version}`));
    return cache.get(version);
  };

  async function showDiff() {
    const [a, b] = await Promise.all([get(Number(older.value)), get(Number(newer.value))]);
    const marked = lineDiff(lines(a.document), lines(b.document));
    const changed = marked.filter(([kind]) => kind !== "same").length;
    diff.replaceChildren(...(changed ? marked : [["same", "(the two versions are the same)"]]).map(([kind, text]) =>
      h("span", { class: kind }, `${kind === "add" ? "+ " : kind === "del" ? "- " : "  "}${text}`)));
  }

  const form = h("form", { class: "card stack-form", id: "run-form" }, h("h2", null, "Run it"),
    h("label", null, "Version", runVersion), h("label", null, "Inputs (JSON object)", inputs), message,
    h("div", null, h("button", { class: "btn primary", type: "submit", id: "run-submit" }, "Start a run")));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    message.textContent = "";
    let given;
    try {
      given = JSON.parse(inputs.value || "{}");
      if (!given || typeof given !== "object" || Array.isArray(given)) throw new Error();
    } catch {
      message.textContent = "inputs: a JSON object, e.g. {\"day\": 3}";
      return;
    }
    try {
      const run = await api(`/definitions/${encodeURIComponent(name)}/runs`,
        { method: "POST", body: { inputs: given, version: Number(runVersion.value) } });
      toast(`Started ${name} version ${run.definition.version}.`, "ok");
      location.hash = `#/workflows/${run.id}`;
    } catch (error) {
      message.textContent = error instanceof ApiError ? error.message : "Could not start the run.";
    }
  });

  clear(container).append(h("section", { class: "view definition" },
    h("div", { class: "toolbar" }, h("h1", null, `Definition ${name}`),
      h("a", { class: "btn small", href: "#/definitions" }, "All definitions")),
    h("div", { class: "panel-grid" },
      h("div", { class: "card" }, h("h2", null, "Versions"), h("div", { class: "table-wrap" }, h("table", { class: "list" },
        h("thead", null, h("tr", null, ["Version", "Stored", "By", "Steps"].map((t) => h("th", null, t)))), versions)),
        h("h2", null, "Latest"), current),
      form),
    h("div", { class: "card" }, h("h2", null, "Diff"),
      h("div", { class: "filters" }, h("label", null, "from ", older), h("label", null, " to ", newer)), diff)));

  api(`/definitions/${encodeURIComponent(name)}`).then(async (latest) => {
    cache.set(latest.version, latest);
    current.textContent = JSON.stringify(latest.document, null, 2);
    const numbers = Array.from({ length: latest.latest_version }, (_, k) => latest.latest_version - k);
    for (const picker of [older, newer, runVersion]) {
      picker.replaceChildren(...numbers.map((n) => h("option", { value: String(n) }, `version ${n}`)));
    }
    older.value = String(Math.max(1, latest.latest_version - 1));
    newer.value = String(latest.latest_version);
    const all = await Promise.all(numbers.map(get));
    versions.replaceChildren(...all.map((v) => h("tr", { "data-version": String(v.version) },
      h("td", { class: "num" }, String(v.version)), h("td", null, dateTime(v.created_at)), h("td", null, v.actor),
      h("td", { class: "num" }, String((v.document.steps || []).length)))));
    older.addEventListener("change", showDiff);
    newer.addEventListener("change", showDiff);
    await showDiff();
  }).catch((error) => {
    container.querySelector(".view").append(emptyState(error instanceof ApiError ? error.message : "Could not load it."));
  });
}
