// Queues: counts by status, the oldest pending job's age, the flow settings (pause/resume,
// rate limit) per queue, and the dead letters.

import { api, ApiError, itemsOf, query } from "./api.js";
import {
  STATUSES, clear, compact, dateTime, debounce, duration, emptyState, h, jobLink,
  parseTime, statusClass, syncChildren, tagChips, toast, S,
} from "./dom.js";
import { subscribe } from "./live.js";

const POLL_MS = 2000;
const DEAD_LIMIT = 100;

/** [{name, counts, oldestAgeSeconds}] from GET /queues, whatever its exact envelope. */
function queuesOf(body) {
  let list = itemsOf(body, "queues");
  if (!list.length && body && typeof body === "object" && !Array.isArray(body)) {
    list = Object.entries(body)
      .filter(([name, value]) => name !== "next" && value && typeof value === "object")
      .map(([name, value]) => ({ queue: name, ...value }));
  }
  return list.map((item) => {
    const counts = item.counts ?? item.by_status ?? item.statuses
      ?? Object.fromEntries(STATUSES.filter((st) => typeof item[st] === "number").map((st) => [st, item[st]]));
    const ageKey = Object.keys(item).find((k) => k.startsWith("oldest"));
    let age = ageKey ? item[ageKey] : null;
    if (typeof age === "string") {
      const time = parseTime(age);
      age = time ? (Date.now() - time.getTime()) / 1000 : Number(age);
    }
    return {
      name: item.queue ?? item.name, counts: counts || {}, oldestAgeSeconds: age,
      paused: Boolean(item.paused), rate: item.rate_per_second ?? null, burst: item.burst ?? null,
      warnings: Array.isArray(item.warnings) ? item.warnings : [],
    };
  }).filter((queue) => queue.name != null).sort((a, b) => String(a.name).localeCompare(String(b.name)));
}

function stackedBar(counts) {
  const total = STATUSES.reduce((sum, st) => sum + (counts[st] || 0), 0);
  return h("div", { class: "bar", title: `${total} jobs` }, total
    ? STATUSES.filter((st) => counts[st]).map((st) => {
      const segment = h("span", { class: `seg ${statusClass(st)}`, title: `${counts[st]} ${st}` });
      segment.style.flexGrow = String(counts[st]);
      return segment;
    })
    : null);
}

function rateText(queue) {
  return queue.rate == null ? "—" : `${queue.rate}/s (burst ${queue.burst})`;
}

/** PUT /queues/{name} {"paused"}: a paused queue is not claimed; running jobs finish. */
async function setPaused(queue, paused, done) {
  try {
    await api(`/queues/${encodeURIComponent(queue.name)}`, { method: "PUT", body: { paused } });
    toast(`Queue ${queue.name} ${paused ? "paused" : "resumed"}.`, "ok");
  } catch (error) {
    toast(error instanceof ApiError ? error.message : "Could not change the queue.", "error");
  }
  done();
}

function queueRow(queue, refresh) {
  return h("tr", { "data-queue": queue.name, class: queue.paused ? "paused" : null },
    h("th", { scope: "row" }, queue.name, queue.paused ? h("span", { class: "pill paused-pill" }, "paused") : null,
      // due jobs that no live worker takes (no worker serves the queue, or none registers a task)
      queue.warnings.map((text) => h("div", { class: "queue-warning error-cell small", role: "note" }, text))),
    h("td", { class: "barcell" }, stackedBar(queue.counts)),
    STATUSES.map((st) => {
      const value = queue.counts[st] || 0;
      return h("td", { class: `num ${value ? statusClass(st) : "zero"}`, "data-status": st }, String(value));
    }),
    h("td", { class: "num age" }, queue.oldestAgeSeconds == null ? "—" : duration(queue.oldestAgeSeconds)),
    h("td", { class: "num rate" }, rateText(queue)),
    h("td", null, h("button", {
      class: `btn small ${queue.paused ? "primary" : ""} pause-toggle`, type: "button", "data-queue": queue.name,
      onclick: (event) => {
        event.currentTarget.disabled = true;
        setPaused(queue, !queue.paused, refresh);
      },
    }, queue.paused ? "Resume" : "Pause")));
}

export function mountQueues(container) {
  const queueBody = h("tbody", { id: "queue-rows" });
  const queueEmpty = emptyState("No queue has had a job yet.");
  const deadBody = h("tbody", { id: "dead-rows" });
  const deadEmpty = emptyState("No dead letters. Jobs that use up their retries show up here.");
  const deadNote = h("span", { class: "muted small" });
  const updated = h("span", { class: "muted small", "aria-live": "off" });
  let disposed = false;
  const retrying = new Set();

  async function retry(job) {
    retrying.add(job.id);
    try {
      await api(`/jobs/${encodeURIComponent(job.id)}/retry`, { method: "POST" });
      toast(`Job ${job.id.slice(0, 8)} queued to run again.`, "ok");
    } catch (error) {
      toast(error instanceof ApiError ? error.message : "Could not retry the job.", "error");
    } finally {
      retrying.delete(job.id);
    }
    refreshDead();
  }

  function deadRow(job) {
    return h("tr", { "data-job": job.id },
      h("td", null, jobLink(job.id)),
      h("td", null, job.step ? `${job.step} (${job.task})` : job.task),
      h("td", null, job.queue),
      h("td", { class: "num" }, String(job.attempts ?? "—")),
      h("td", { class: "error-cell", title: compact(job.last_error, 2000) },
        compact(job.last_error ?? "", 160)),
      h("td", null, dateTime(job.updated_at)),
      h("td", { class: "tagcell" }, tagChips(job.tags)),
      h("td", null, h("button", {
        class: "btn small primary retry", type: "button", "data-job": job.id,
        onclick: (event) => {
          event.currentTarget.disabled = true;
          retry(job);
        },
      }, "Retry")));
  }

  async function refreshQueues() {
    try {
      const queues = queuesOf(await api("/queues"));
      if (disposed) return;
      syncChildren(queueBody, queues, {
        key: (q) => q.name,
        signature: (q) => JSON.stringify([q.counts, q.oldestAgeSeconds == null ? null : duration(q.oldestAgeSeconds),
          q.paused, q.rate, q.burst, q.warnings]),
        build: (q) => queueRow(q, refreshQueues),
      });
      queueEmpty.hidden = queues.length > 0;
      updated.textContent = `updated ${new Date().toLocaleTimeString()}`;
    } catch (error) {
      if (!disposed) updated.textContent = `could not refresh: ${error.message}`;
    }
  }

  async function refreshDead() {
    try {
      const body = await api(`/jobs${query({ status: S.DEAD, limit: DEAD_LIMIT })}`);
      if (disposed) return;
      const jobs = itemsOf(body, "jobs").filter((job) => !retrying.has(job.id));
      syncChildren(deadBody, jobs, {
        key: (job) => job.id,
        signature: (job) => JSON.stringify([job.attempts, job.updated_at, job.last_error, job.status]),
        build: deadRow,
      });
      deadEmpty.hidden = jobs.length > 0;
      deadNote.textContent = body && body.next ? `showing the first ${jobs.length}` : `${jobs.length} dead`;
    } catch (error) {
      if (!disposed) deadNote.textContent = `could not refresh: ${error.message}`;
    }
  }

  const refreshSoon = debounce(() => { refreshQueues(); refreshDead(); }, 250);
  const unsubscribe = subscribe((event) => {
    if (event.type === "DeadLettered" || event.type === "Retried" || event.type === "Cancelled") refreshSoon();
  });

  clear(container).append(h("section", { class: "view queues" },
    h("div", { class: "toolbar" }, h("h1", null, "Queues"), h("div", { class: "spacer" }), updated),
    h("div", { class: "card flush" }, h("div", { class: "table-wrap" }, h("table", { class: "list queues-table" },
      h("thead", null, h("tr", null,
        h("th", null, "Queue"), h("th", null, "Share"),
        STATUSES.map((st) => h("th", { class: `num status-head ${statusClass(st)}` }, h("span", { class: "swatch" }), st)),
        h("th", { class: "num" }, "Oldest pending"), h("th", { class: "num" }, "Rate limit"), h("th", null, ""))),
      queueBody)), queueEmpty),
    h("div", { class: "toolbar section" }, h("h2", null, "Dead letters"), deadNote),
    h("div", { class: "card flush" }, h("div", { class: "table-wrap" }, h("table", { class: "list dead-table" },
      h("thead", null, h("tr", null, ["Job", "Task", "Queue", "Attempts", "Last error", "Died", "Tags", ""]
        .map((label) => h("th", null, label)))),
      deadBody)), deadEmpty)));

  refreshQueues();
  refreshDead();
  const timer = setInterval(() => { refreshQueues(); refreshDead(); }, POLL_MS);
  return () => {
    disposed = true;
    clearInterval(timer);
    refreshSoon.cancel();
    unsubscribe();
  };
}
