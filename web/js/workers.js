// Workers: who is alive, how many slots each has, what runs in them, when each was last seen.

import { api, itemsOf } from "./api.js";
import { ago, clear, emptyState, h, jobLink, syncChildren } from "./dom.js";

const POLL_MS = 2000;
const MAX_SLOT_BOXES = 64;

function runningJobsOf(worker) {
  const running = worker.running_jobs ?? worker.jobs ?? worker.running;
  if (Array.isArray(running)) {
    // GET /workers lists {job_id, task, step, workflow_id, started_at, slot}.
    return running.map((job) => (job && typeof job === "object"
      ? { ...job, id: job.job_id ?? job.id }
      : { id: job }));
  }
  return [];
}

function runningCount(worker) {
  const jobs = runningJobsOf(worker);
  if (jobs.length) return jobs.length;
  if (typeof worker.running === "number") return worker.running;
  if (typeof worker.running_count === "number") return worker.running_count;
  return 0;
}

function lastSeen(worker) {
  return worker.last_seen ?? worker.last_seen_at ?? worker.heartbeat_at ?? worker.updated_at;
}

function slots(used, total) {
  const boxes = Math.min(total, MAX_SLOT_BOXES);
  return h("div", { class: "slots", title: `${used} of ${total} slots busy` },
    Array.from({ length: boxes }, (_, i) => h("span", { class: `slot${i < used ? " busy st-running" : ""}` })),
    total > MAX_SLOT_BOXES ? h("span", { class: "muted" }, ` +${total - MAX_SLOT_BOXES}`) : null);
}

function workerCard(worker) {
  const jobs = runningJobsOf(worker);
  const used = runningCount(worker);
  const total = Number(worker.concurrency ?? worker.slots ?? 0);
  const queues = Array.isArray(worker.queues) ? worker.queues : String(worker.queues ?? "").split(",").filter(Boolean);
  return h("article", { class: "card worker", "data-worker": worker.name },
    h("header", null,
      h("h2", null, worker.name ?? "worker"),
      h("span", { class: "muted" }, [worker.host, worker.pid != null ? `pid ${worker.pid}` : null].filter(Boolean).join(" · "))),
    h("div", { class: "worker-row" },
      h("span", { class: "label" }, "Slots"),
      slots(used, total),
      h("span", { class: "num" }, `${used} / ${total || "?"} busy`)),
    h("div", { class: "worker-row" },
      h("span", { class: "label" }, "Queues"),
      h("span", { class: "tags" }, queues.map((q) => h("span", { class: "tag" }, q)))),
    h("div", { class: "worker-row" },
      h("span", { class: "label" }, "Running"),
      jobs.length
        ? h("ul", { class: "running-jobs" }, jobs.map((job) => h("li", null, jobLink(job.id),
          job.task ? h("span", { class: "muted" }, ` ${job.step ? `${job.step} (${job.task})` : job.task}`) : null,
          job.started_at ? h("span", { class: "muted small" }, ` · for ${ago(job.started_at).replace(" ago", "")}`) : null)))
        : h("span", { class: "muted" }, used ? `${used} job${used === 1 ? "" : "s"}` : "idle")),
    h("div", { class: "worker-row" },
      h("span", { class: "label" }, "Last seen"),
      h("span", { class: "seen" }, ago(lastSeen(worker)))));
}

export function mountWorkers(container) {
  const grid = h("div", { class: "workers-grid", id: "workers" });
  const empty = emptyState("No live workers. Start one with `qforge worker`.");
  const summary = h("span", { class: "muted small" });
  let disposed = false;

  async function refresh() {
    try {
      const workers = itemsOf(await api("/workers"), "workers");
      if (disposed) return;
      workers.sort((a, b) => String(a.name).localeCompare(String(b.name)));
      syncChildren(grid, workers, {
        key: (w) => w.name,
        signature: (w) => JSON.stringify([w, ago(lastSeen(w))]),
        build: workerCard,
      });
      empty.hidden = workers.length > 0;
      const total = workers.reduce((sum, w) => sum + Number(w.concurrency ?? 0), 0);
      const busy = workers.reduce((sum, w) => sum + runningCount(w), 0);
      summary.textContent = `${workers.length} worker${workers.length === 1 ? "" : "s"} · ${busy} of ${total} slots busy`;
    } catch (error) {
      if (!disposed) summary.textContent = `could not refresh: ${error.message}`;
    }
  }

  clear(container).append(h("section", { class: "view workers" },
    h("div", { class: "toolbar" }, h("h1", null, "Workers"), h("div", { class: "spacer" }), summary),
    grid, empty));
  refresh();
  const timer = setInterval(refresh, POLL_MS);
  return () => {
    disposed = true;
    clearInterval(timer);
  };
}
