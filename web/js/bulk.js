// Bulk actions on the Jobs list: every job matching the list's filters is cancelled or retried
// (POST /jobs/cancel, /jobs/retry), after a confirmation that names how many (a dry run counts
// them first). The API works in bounded batches, so a large selection is no long transaction.

import { api, ApiError } from "./api.js";
import { h, toast } from "./dom.js";

const ACTIONS = {
  cancel: { label: "Cancel all matching…", verb: "Cancel", done: "Cancelled", path: "/jobs/cancel" },
  retry: { label: "Retry all matching…", verb: "Retry", done: "Retried", path: "/jobs/retry" },
};

/** The POST body's filter from the list's filters (tag "key:value" becomes tags {key: value}). */
export function bulkFilter(filters) {
  const filter = {};
  for (const name of ["status", "queue", "task"]) if (filters[name]) filter[name] = filters[name];
  if (filters.tag) {
    const at = filters.tag.indexOf(":");
    filter.tags = { [filters.tag.slice(0, at)]: filters.tag.slice(at + 1) };
  }
  return filter;
}

function describe(filter) {
  const parts = Object.entries(filter).map(([key, value]) =>
    key === "tags" ? Object.entries(value).map(([k, v]) => `tag ${k}:${v}`).join(", ") : `${key} ${value}`);
  return parts.length ? parts.join(", ") : "no filter: every job it applies to";
}

export function bulkBar(filters, onDone) {
  const filter = bulkFilter(filters);
  const dialog = h("dialog", { class: "confirm", id: "bulk-confirm" });
  const bar = h("div", { class: "bulk-bar", id: "bulk-actions" },
    h("span", { class: "muted small" }, "Select all matching (", describe(filter), "):"),
    Object.entries(ACTIONS).map(([name, action]) => h("button", {
      class: `btn small ${name === "cancel" ? "danger" : ""}`, type: "button", id: `bulk-${name}`,
      onclick: () => ask(name, action),
    }, action.label)),
    dialog);

  async function ask(name, action) {
    let count;
    try {
      count = (await api(action.path, { method: "POST", body: { filter, dry_run: true } })).count;
    } catch (error) {
      toast(error instanceof ApiError ? error.message : "Could not count the jobs.", "error");
      return;
    }
    const confirm = h("button", { class: `btn ${name === "cancel" ? "danger" : "primary"}`, type: "button",
      id: "bulk-confirm-yes", disabled: count === 0 }, `${action.verb} ${count} job${count === 1 ? "" : "s"}`);
    const keep = h("button", { class: "btn", type: "button", id: "bulk-confirm-no" }, "Keep them");
    dialog.replaceChildren(
      h("h2", null, `${action.verb} ${count} matching job${count === 1 ? "" : "s"}?`),
      h("p", { class: "muted" }, count === 0 ? "No job matching these filters can be "
        + `${name === "cancel" ? "cancelled" : "retried"}.` : `Jobs matching ${describe(filter)}.`
        + ` They are ${name === "cancel" ? "cancelled" : "run again"} in batches; each job's event names its batch.`),
      h("div", { class: "actions" }, keep, confirm));
    keep.addEventListener("click", () => dialog.close());
    confirm.addEventListener("click", async () => {
      confirm.disabled = true;
      try {
        const done = await api(action.path, { method: "POST", body: { filter } });
        toast(`${action.done} ${done.count} job${done.count === 1 ? "" : "s"}.`, "ok");
        dialog.close();
        onDone();
      } catch (error) {
        toast(error instanceof ApiError ? error.message : "The bulk action failed.", "error");
        confirm.disabled = false;
      }
    });
    dialog.showModal();
  }
  return bar;
}
