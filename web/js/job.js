// Job detail: what the job is now, what it was given and gave back, and its audit trail.

import { api, ApiError } from "./api.js";
import {
  CANCELLABLE, RETRYABLE, clear, clock, codeBlock, dateTime, debounce, emptyState,
  eventBadge, facts, h, oneAtATime, pill, statusClass, tagChips, toast, workflowLink, EVENT_STATUS, S,
} from "./dom.js";
import { auditStatus } from "./audit.js";
import { crumbs } from "./crumbs.js";
import { subscribe } from "./live.js";
import { summarize } from "./summary.js";

const FALLBACK_REFRESH_MS = 5000; // in case the stream is down

/** The vertical audit trail, shared with the workflow view. */
export function historyList(events, { stepOf, label } = {}) {
  if (!events.length) return emptyState("No events yet.");
  return h("ol", { class: "history", "aria-label": label || "Event history" },
    events.map((event) => {
      const summary = summarize(event);
      return h("li", {
        class: `history-item ${statusClass(EVENT_STATUS[event.type])}`,
        "data-type": event.type, "data-position": event.position,
      },
      h("span", { class: "dot", "aria-hidden": "true" }),
      h("div", { class: "history-head" },
        eventBadge(event.type),
        stepOf && stepOf(event) ? h("span", { class: "history-step" }, stepOf(event)) : null,
        h("span", { class: "history-time" }, clock(event.occurred_at)),
        h("span", { class: "muted" }, `by ${event.actor ?? "—"}`)),
      h("div", { class: "history-summary" },
        summary ? h("span", null, summary) : null,
        event.data && Object.keys(event.data).length
          ? h("details", null, h("summary", null, "data"), codeBlock(event.data))
          : null));
    }));
}

// Heartbeats (one every few seconds while a job runs) are hidden from histories unless the
// reader asks for them; one choice for job and workflow pages alike.
let showHeartbeats = false;

/** The "heartbeats" checkbox of a history heading, and the events it lets through. */
export function heartbeatToggle(events, onChange) {
  const beats = events.filter((event) => event.type === "Heartbeat").length;
  const box = h("input", { type: "checkbox", class: "heartbeat-toggle", checked: showHeartbeats });
  box.addEventListener("change", () => { showHeartbeats = box.checked; onChange(); });
  return h("label", { class: "check small history-toggle" }, box,
    ` show ${beats} heartbeat${beats === 1 ? "" : "s"}`);
}

export function visibleHistory(events) {
  return showHeartbeats ? events : events.filter((event) => event.type !== "Heartbeat");
}

/** Re-render without closing the history entries the reader opened. */
export function keepOpenDetails(root, render) {
  const open = new Set([...root.querySelectorAll("li[data-position] details[open]")]
    .map((details) => details.closest("li").dataset.position));
  render();
  for (const item of root.querySelectorAll("li[data-position]")) {
    if (open.has(item.dataset.position)) item.querySelector("details")?.setAttribute("open", "");
  }
}

const TIMES = ["never", "once", "twice"];

/** "1 of 4, handed back once": the attempts that count against the budget (GET /jobs/{id}
 * counted_attempts), and apart from them the hand-backs of stopping workers (Released). */
function attemptsText(job, events) {
  const allowed = job.max_retries != null ? job.max_retries + 1 : null;
  const counted = job.counted_attempts ?? job.attempts ?? 0;
  const released = events.filter((event) => event.type === "Released").length;
  const text = allowed != null ? `${counted} of ${allowed}` : String(counted);
  return released ? `${text}, handed back ${TIMES[released] ?? `${released} times`}` : text;
}

function outcome(job) {
  const blocks = [];
  const hasError = job.last_error != null && job.last_error !== "";
  const hasResult = job.result !== undefined && job.result !== null;
  if (hasResult) {
    blocks.push(h("div", { class: "card" }, h("h3", null, "Result"), codeBlock(job.result)));
  }
  if (hasError) {
    // A job that succeeded after a retry keeps the error of its failed attempt.
    const earlier = job.status === S.SUCCEEDED;
    const block = h("div", { class: `card${earlier ? " earlier" : ""}` },
      h("h3", null, earlier ? "Error of an earlier attempt" : "Error"), codeBlock(job.last_error, "error"));
    if (earlier) blocks.push(block);
    else blocks.unshift(block);
  }
  if (!blocks.length) {
    blocks.push(h("div", { class: "card" }, h("h3", null, "Result"),
      h("p", { class: "muted" }, "No result yet.")));
  }
  return blocks;
}

/** The section of a job's or workflow's page in `container`, saying it loads. */
export function detailView(container, what, id) {
  const root = h("section", { class: `view ${what}`, [`data-${what}`]: id });
  clear(container).append(root);
  root.append(h("p", { class: "muted" }, `Loading ${what}…`));
  return root;
}

/** What a detail view shows when its job or workflow could not be read: not found, or why not. */
export function notLoaded(what, id, error) {
  return [
    crumbs(what, { fallback: `${what}s` }),
    emptyState(error instanceof ApiError && error.status === 404
      ? `No ${what} ${id}.` : `Could not load the ${what}: ${error.message}`),
  ];
}

export function mountJob(container, jobId) {
  const root = detailView(container, "job", jobId);
  let disposed = false;
  const audit = auditStatus("job", jobId);

  async function act(action) {
    try {
      await api(`/jobs/${encodeURIComponent(jobId)}/${action}`, { method: "POST" });
      toast(action === "retry" ? "Job queued to run again." : "Job cancelled.", "ok");
    } catch (error) {
      toast(error instanceof ApiError ? error.message : `Could not ${action} the job.`, "error");
    }
    load();
  }

  function render(job, events) {
    const buttons = [];
    if (CANCELLABLE.has(job.status)) {
      buttons.push(h("button", { class: "btn danger", id: "job-cancel", type: "button", onclick: () => act("cancel") }, "Cancel"));
    }
    if (RETRYABLE.has(job.status)) {
      buttons.push(h("button", { class: "btn primary", id: "job-retry", type: "button", onclick: () => act("retry") }, "Retry"));
    }
    clear(root).append(
      crumbs("job", { fallback: "jobs" }),
      h("header", { class: "detail-header" },
        h("div", null,
          h("h1", null, h("span", { class: "task" }, job.step ? `${job.step}` : job.task ?? "job"),
            " ", h("span", { id: "job-status" }, pill(job.status))),
          h("code", { class: "fullid" }, job.id),
          audit.el),
        h("div", { class: "actions" }, buttons)),
      job.waiting_for_worker
        ? h("p", { class: "card error-cell", id: "job-waiting-for-worker", role: "note" }, job.waiting_for_worker)
        : null,
      h("div", { class: "detail-grid" },
        h("div", { class: "card" }, facts([
          ["Task", job.task],
          ["Queue", job.queue],
          ["Attempts", h("span", { id: "job-attempts", title: "attempts that count against max_retries; "
            + "a worker that stops hands its job back (Released) without using one" }, attemptsText(job, events))],
          ["Priority", String(job.priority ?? 0)],
          ["Worker", job.worker || null],
          ["Heartbeat", job.heartbeat_at ? dateTime(job.heartbeat_at) : null],
          ["Run at", dateTime(job.run_at)],
          ["Created", dateTime(job.created_at)],
          ["Updated", dateTime(job.updated_at)],
          job.workflow_id ? ["Workflow", h("span", null, workflowLink(job.workflow_id),
            job.step ? ` · step ${job.step}` : "")] : null,
          ["Tags", tagChips(job.tags)],
        ])),
        h("div", { class: "stack" },
          h("div", { class: "card" }, h("h3", null, "Payload"), codeBlock(job.payload ?? {})),
          ...outcome(job))),
      h("h2", null, "History ", heartbeatToggle(events, () => render(job, events))),
      historyList(visibleHistory(events), { label: "Job history" }));
  }

  // One load at a time; a change seen during a load triggers one more after it.
  const load = oneAtATime(async () => {
    try {
      const [job, history] = await Promise.all([
        api(`/jobs/${encodeURIComponent(jobId)}`),
        api(`/jobs/${encodeURIComponent(jobId)}/events`),
      ]);
      if (!disposed) keepOpenDetails(root, () => render(job, (history && history.events) || []));
    } catch (error) {
      if (!disposed) clear(root).append(...notLoaded("job", jobId, error));
    }
  }, () => disposed);

  const refresh = debounce(load, 120);
  const unsubscribe = subscribe((event) => {
    if (event.stream_id === jobId && event.type !== "Heartbeat") refresh();
  });
  const timer = setInterval(load, FALLBACK_REFRESH_MS);
  load();
  return () => {
    disposed = true;
    refresh.cancel();
    clearInterval(timer);
    audit.dispose();
    unsubscribe();
  };
}
