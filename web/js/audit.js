// "Verified up to checkpoint N": the server's check of an execution's proof
// (GET /jobs/{id}/proof, /workflows/{id}/proof), shown on its detail page.
//
// A proof costs the server a Merkle path per event, so it is fetched once when
// the page opens and then every CHECK_MS (checkpoints come every ~10 s), not on
// every live refresh of the page. The same element is re-attached by each render.

import { api, ApiError } from "./api.js";
import { h } from "./dom.js";

const CHECK_MS = 15000;

function describe(status) {
  if (status.verified) {
    const waiting = status.events - status.covered;
    return ["ok", `verified up to checkpoint ${status.checkpoint}`,
      waiting ? `${waiting} newer event(s) wait for the next checkpoint` : `all ${status.events} events covered`];
  }
  if (!status.problems.length || status.checkpoint == null) {
    return ["pending", "not checkpointed yet", "the monitor checkpoints the log every few seconds"];
  }
  return ["bad", `audit problem: ${status.problems[0]}`, status.problems.join("\n")];
}

/** An element that shows the audit status of a job or workflow; call dispose() when the view goes. */
export function auditStatus(kind, id) {
  const el = h("span", { class: "audit-status pending", id: `${kind}-audit`, "data-state": "loading" }, "audit…");
  let disposed = false;

  async function check() {
    try {
      const proof = await api(`/${kind}s/${encodeURIComponent(id)}/proof`);
      if (disposed) return;
      const [state, text, title] = describe(proof.status);
      el.className = `audit-status ${state}`;
      el.dataset.state = state;
      el.title = title;
      el.textContent = text;
    } catch (error) {
      if (disposed) return;
      el.className = "audit-status pending";
      el.dataset.state = "unknown";
      el.textContent = error instanceof ApiError && error.status === 404 ? "" : "audit status unavailable";
    }
  }

  const timer = setInterval(check, CHECK_MS);
  check();
  return { el, dispose() { disposed = true; clearInterval(timer); } };
}
