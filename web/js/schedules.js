// Schedules: every cron schedule with its next fire time, its last tick and what it started;
// pause, resume and delete. Ticks and changes arrive as events (ScheduleFired, ...).

import { api, ApiError } from "./api.js";
import { clear, dateTime, emptyState, formatDateTime, h, jobLink, parseTime, toast, workflowLink } from "./dom.js";
import { pollRows } from "./polled.js";
import { scheduleForm } from "./schedule_form.js";

function target(schedule) {
  if (schedule.job) return `job ${schedule.job.task} → ${schedule.job.queue ?? "default"}`;
  return `definition ${schedule.definition}${schedule.version ? ` version ${schedule.version}` : ""}`;
}

/** A time in the schedule's own zone (the zone its cron is read in), and in the browser's
 * when that differs: both name their zone. */
function zonedTimes(iso, schedule) {
  const time = parseTime(iso);
  if (!time) return "—";
  const own = formatDateTime(time, schedule.timezone);
  const local = formatDateTime(time);
  return h("span", { class: "zoned" }, dateTime(iso, { zone: schedule.timezone }),
    own === local ? null : h("span", { class: "muted small local-time" }, `your time ${local}`));
}

function lastRun(schedule) {
  if (!schedule.last_execution_id) return "—";
  return schedule.job ? jobLink(schedule.last_execution_id) : workflowLink(schedule.last_execution_id);
}

export function mountSchedules(container) {
  const body = h("tbody", { id: "schedule-rows" });
  const empty = emptyState("No schedules yet: the form below creates one (or POST /schedules).");
  const updated = h("span", { class: "muted small", "aria-live": "off" });

  async function act(schedule, request, done) {
    try {
      await api(`/schedules/${encodeURIComponent(schedule.name)}`, request);
      toast(`Schedule ${schedule.name} ${request.method === "DELETE" ? "deleted"
        : request.body.paused ? "paused" : "resumed"}.`, "ok");
    } catch (error) {
      toast(error instanceof ApiError ? error.message : "Could not change the schedule.", "error");
    }
    done();
  }

  function row(schedule) {
    const button = (label, request, cls = "") => h("button", {
      class: `btn small ${cls}`, type: "button", "data-schedule": schedule.name,
      onclick: (event) => {
        event.currentTarget.disabled = true;
        act(schedule, request, () => rows.refresh());
      },
    }, label);
    const classes = [schedule.paused ? "paused" : null, schedule.error ? "failing" : null].filter(Boolean);
    return h("tr", { "data-schedule": schedule.name, class: classes.join(" ") || null },
      h("th", { scope: "row", class: "schedule-name" }, h("code", null, schedule.name),
        schedule.paused ? h("span", { class: "pill paused-pill" }, "paused") : null,
        schedule.error ? h("div", { class: "schedule-error", role: "note" }, schedule.error) : null),
      h("td", null, h("code", null, schedule.cron), " ", h("span", { class: "muted small" }, schedule.timezone)),
      h("td", null, target(schedule)),
      h("td", { class: "next-fire" }, schedule.next_fire_at ? zonedTimes(schedule.next_fire_at, schedule) : "—"),
      h("td", { class: "last-tick" }, schedule.last_tick ? zonedTimes(schedule.last_tick, schedule) : "—"),
      h("td", null, lastRun(schedule)),
      h("td", { class: "num" }, String(schedule.fired)),
      h("td", { class: "num" }, String(schedule.skipped)),
      h("td", null, schedule.catch_up),
      h("td", null,
        schedule.paused
          ? button("Resume", { method: "PATCH", body: { paused: false } }, "primary resume")
          : button("Pause", { method: "PATCH", body: { paused: true } }, "pause"),
        " ",
        button("Delete", { method: "DELETE" }, "danger delete")));
  }

  const rows = pollRows({
    path: "/schedules", name: "schedules", body, empty, updated, key: (schedule) => schedule.name, build: row,
    changes: (event) => String(event.type).startsWith("Schedule"),
  });

  clear(container).append(h("section", { class: "view schedules" },
    h("div", { class: "toolbar" }, h("h1", null, "Schedules"), h("div", { class: "spacer" }), updated),
    h("div", { class: "card flush" }, h("div", { class: "table-wrap" }, h("table", { class: "list schedules-table" },
      h("thead", null, h("tr", null, ["Schedule", "Cron", "Starts", "Next fire", "Last tick", "Last run",
        "Fired", "Skipped", "Catch up", ""].map((label) => h("th", null, label)))),
      body)), empty), scheduleForm(() => rows.refresh())));

  return rows.dispose;
}
