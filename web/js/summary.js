// One line that says what an event means, for the timeline and the histories.

import { compact, duration, parseTime, S } from "./dom.js";

function attempt(data) {
  return data.attempt != null ? `attempt ${data.attempt}` : null;
}

function at(iso) {
  const time = parseTime(iso);
  return time ? `at ${time.toLocaleTimeString()}` : null;
}

/** `a.x = "doB"`, or `x = "doB"` without the step (on an edge that starts at it). */
export function describeCondition(when, { withStep = true } = {}) {
  if (!when || typeof when !== "object") return null;
  const path = when.path || "output";
  const target = withStep ? `${when.step ?? "?"}.${path}` : path;
  if (when.equals != null) return `${target} = ${compact(JSON.stringify(when.equals), 40)}`;
  if (when.not_equals != null) return `${target} ≠ ${compact(JSON.stringify(when.not_equals), 40)}`;
  if (when.in != null) return `${target} in ${compact(JSON.stringify(when.in), 40)}`;
  return compact(when, 60);
}

const condition = (when) => describeCondition(when);

const DESCRIBE = {
  Enqueued: (d) => [
    d.task ? `task ${d.task}` : null,
    d.status && d.status !== S.PENDING ? d.status : null,
    d.priority ? `priority ${d.priority}` : null,
    d.max_retries != null ? `max retries ${d.max_retries}` : null,
    d.when ? `when ${condition(d.when)}` : null,
    d.payload && Object.keys(d.payload).length ? `payload ${compact(d.payload, 80)}` : null,
  ],
  StepUnblocked: (d) => [d.status ? `now ${d.status}` : "unblocked"],
  Claimed: (d) => [attempt(d), d.worker ? `by ${d.worker}` : null],
  Heartbeat: (d) => [attempt(d), d.worker ? `from ${d.worker}` : null],
  Released: (d) => [attempt(d), "handed back without using an attempt"],
  Succeeded: (d) => [attempt(d), "result" in d ? `result ${compact(d.result, 90)}` : null],
  Triggered: (d) => ["payload" in d ? `payload ${compact(d.payload, 90)}` : "triggered"],
  Failed: (d) => [attempt(d), d.reason && d.reason !== "error" ? d.reason : null,
    d.error != null ? compact(d.error, 140) : null],
  Retried: (d) => [
    d.manual ? "manual retry" : attempt(d),
    d.delay_seconds != null && !d.manual ? `retry in ${duration(Number(d.delay_seconds))}` : null,
    d.manual ? null : at(d.run_at),
  ],
  DeadLettered: (d) => [attempt(d), "retries exhausted", d.error != null ? compact(d.error, 120) : null],
  Cancelled: (d) => [d.reason || "cancelled"],
  Skipped: (d) => [d.reason || (d.error ? compact(d.error, 120) : "condition not met")],
  WorkflowSubmitted: (d) => [
    d.name ? `“${d.name}”` : null,
    Array.isArray(d.steps) ? `${d.steps.length} steps` : null,
  ],
  WorkflowSucceeded: () => ["all steps done"],
  WorkflowFailed: (d) => [d.error != null ? compact(d.error, 140) : "failed"],
  WorkflowCancelled: (d) => [d.reason || "cancelled"],
  TokenCreated: (d) => [d.name ? `token “${d.name}”` : null, d.scope ? `scope ${d.scope}` : null],
  TokenRevoked: (d) => [d.name ? `token “${d.name}” revoked` : "revoked"],
  StepReopened: (d) => [d.reason || "reopened", d.status ? `now ${d.status}` : null],
  WorkflowResumed: (d) => [d.reason || "resumed",
    Array.isArray(d.steps) ? `${d.steps.length} step${d.steps.length === 1 ? "" : "s"} again` : null],
  DefinitionStored: (d) => [d.name ? `definition “${d.name}”` : null,
    d.document && Array.isArray(d.document.steps) ? `${d.document.steps.length} steps` : null],
  ScheduleCreated: (d) => [d.name ? `schedule “${d.name}”` : null, spec(d.spec), next(d.next_at)],
  ScheduleUpdated: (d) => [spec(d.spec), next(d.next_at)],
  SchedulePaused: () => ["paused"],
  ScheduleResumed: (d) => ["resumed", next(d.next_at)],
  ScheduleFired: (d) => [d.tick ? `tick of ${when(d.tick)}` : null,
    d.execution_id ? `started ${d.kind || "job"} …${String(d.execution_id).slice(-8)}` : null, next(d.next_at)],
  ScheduleSkipped: (d) => [`${d.count} missed tick${d.count === 1 ? "" : "s"} not fired (catch_up ${d.catch_up})`,
    next(d.next_at)],
  ScheduleDeleted: () => ["deleted"],
  QueueConfigured: (d) => [d.rate_per_second != null
    ? `at most ${d.rate_per_second}/s${d.burst != null ? `, burst ${d.burst}` : ""}` : "no rate limit"],
  QueuePaused: () => ["paused: nothing is claimed"],
  QueueResumed: () => ["resumed"],
};

function when(iso) {
  const time = parseTime(iso);
  return time ? time.toLocaleString([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23" }) : iso;
}

function next(iso) {
  return iso ? `next ${when(iso)}` : null;
}

function spec(s) {
  if (!s || typeof s !== "object") return null;
  const what = s.job ? `job ${s.job.task}` : s.definition ? `definition ${s.definition}` : null;
  return [s.cron ? `cron ${s.cron}${s.timezone ? ` ${s.timezone}` : ""}` : null, what].filter(Boolean).join(", ");
}

/** "attempt 2 · retry in 400 ms · at 14:03:22" */
export function summarize(event) {
  const data = event.data && typeof event.data === "object" ? event.data : {};
  const describe = DESCRIBE[event.type];
  // An event type this build does not know: its fields by name, not raw JSON.
  const parts = describe ? describe(data)
    : Object.entries(data).map(([key, value]) => `${key} ${typeof value === "object" ? compact(value, 60) : value}`);
  return parts.filter(Boolean).join(" · ");
}
