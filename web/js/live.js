// The one live connection: GET /events/stream over Server-Sent Events.
//
// Every view subscribes here instead of opening its own stream. Guarantees
// kept on this side:
// - no duplicates: events are delivered once per `position` (a resumed stream
//   may overlap what we already have, e.g. when the URL still says ?after=);
// - no gaps: on a network error EventSource reconnects by itself and sends
//   Last-Event-ID; when it gives up (a non-200 answer such as a restart or a
//   401) we open a new one with ?after=<last id seen>.
// EventSource cannot send the token in a header, and a token in a URL ends up
// in logs: each stream opens with a short-lived ticket from
// POST /events/stream-ticket instead (an expired one fails the reconnect, and
// the reopen below asks for a fresh one).

import { api, ApiError, query } from "./api.js";

// EventSource only dispatches named events ("event: Claimed") to listeners
// registered for that name: every type of the log, from GET /js/states.js.
import { EVENT_TYPES } from "./states.js";

export { EVENT_TYPES };

const SEEN_LIMIT = 20000;
const RECONNECT_MAX_MS = 10000;

const subscribers = new Set();
const stateSubscribers = new Set();
const seenPositions = new Set();
const seenOrder = [];

let source = null;
let lastEventId = null;
let state = "connecting";
let reconnectDelay = 500;
let reconnectTimer = null;
let opened = 0; // how many EventSources we have made: a stale probe must not replace a newer one

/** fn(event) for every new event, in stream order; returns an unsubscribe function. */
export function subscribe(fn) {
  subscribers.add(fn);
  return () => subscribers.delete(fn);
}

/** fn(state) now and on every change: "connecting" | "live" | "reconnecting". */
export function onState(fn) {
  stateSubscribers.add(fn);
  fn(state);
  return () => stateSubscribers.delete(fn);
}

function setState(next) {
  if (next === state) return;
  state = next;
  for (const fn of stateSubscribers) fn(state);
}

function remember(position) {
  seenPositions.add(position);
  seenOrder.push(position);
  if (seenOrder.length > SEEN_LIMIT) seenPositions.delete(seenOrder.shift());
}

function onMessage(message) {
  if (message.lastEventId) lastEventId = message.lastEventId;
  let event;
  try {
    event = JSON.parse(message.data);
  } catch {
    return; // a malformed message cannot be shown; the next one still can
  }
  if (!event || typeof event !== "object") return;
  if (event.position != null) {
    if (seenPositions.has(event.position)) return;
    remember(event.position);
  }
  learnJob(event);
  for (const fn of subscribers) {
    try {
      fn(event);
    } catch (error) {
      console.warn("live subscriber failed", error); // one broken view must not stop the others
    }
  }
}

async function open() {
  clearTimeout(reconnectTimer);
  if (source) source.close();
  source = null;
  const mine = ++opened;
  let ticket;
  try {
    ({ ticket } = await api("/events/stream-ticket", { method: "POST" }));
  } catch (error) {
    if (mine === opened) {
      setState("reconnecting");
      scheduleReopen();
    }
    return;
  }
  if (mine !== opened) return; // a newer open() (a token entered meanwhile) won
  // The first stream opens with a little recent history; reconnects resume exactly.
  const backlog = lastEventId ? undefined : 200;
  const url = `/events/stream${query({ after: lastEventId, backlog, ticket })}`;
  source = new EventSource(url);
  source.addEventListener("open", () => {
    reconnectDelay = 500;
    setState("live");
  });
  source.addEventListener("error", () => {
    if (source.readyState === EventSource.CLOSED) {
      setState("reconnecting");
      scheduleReopen();
    } else {
      setState("reconnecting"); // the browser retries with Last-Event-ID
    }
  });
  for (const type of EVENT_TYPES) source.addEventListener(type, onMessage);
  source.addEventListener("message", onMessage);
}

function scheduleReopen() {
  if (source) source.close();
  clearTimeout(reconnectTimer);
  reconnectTimer = setTimeout(probeThenOpen, reconnectDelay);
  reconnectDelay = Math.min(reconnectDelay * 2, RECONNECT_MAX_MS);
}

// EventSource cannot tell us why it failed. One ordinary request can: a 401
// opens the token form (api() handles it), a dead server throws.
async function probeThenOpen() {
  const before = opened;
  try {
    await api(`/events${query({ after: lastEventId, limit: 1 })}`);
  } catch (error) {
    if (!(error instanceof ApiError) || error.status >= 500) {
      if (before === opened) scheduleReopen();
      return;
    }
  }
  if (before === opened) open(); // unless the token form already reopened it
}

export function start() {
  window.addEventListener("qforge:token", () => open());
  open();
}

// ---------------------------------------------------------------------------
// What the timeline needs to know about a job that only Enqueued events (and
// GET /jobs/{id}) carry: queue, step, task.

const jobs = new Map();
const streamNames = new Map(); // a workflow's, schedule's, queue's, token's ... id -> its name
const nameLookups = new Set(); // ids asked for (once each)
const SCHEDULES_REREAD_MS = 5000;
let schedulesReadAt = -Infinity;
const lookups = [];
const jobSubscribers = new Set();
let lookupsInFlight = 0;
const LOOKUP_CONCURRENCY = 4;
const JOB_CACHE_LIMIT = 5000;

function rememberJob(id, info) {
  jobs.set(id, { ...(jobs.get(id) || {}), ...info });
  if (jobs.size > JOB_CACHE_LIMIT) jobs.delete(jobs.keys().next().value);
}

function learnJob(event) {
  if (event.stream_type === "job" && event.type === "Enqueued" && event.data) {
    rememberJob(event.stream_id, {
      queue: event.data.queue, step: event.data.step, task: event.data.task,
    });
  }
  const data = event.data || {};
  // The events that carry their stream's name (a queue's events all carry it).
  const name = ["WorkflowSubmitted", "ScheduleCreated", "DefinitionStored", "TokenCreated", "TokenRevoked"]
    .includes(event.type) ? data.name : event.stream_type === "queue" ? data.queue : null;
  if (name) rememberName(event.stream_id, name);
}

function rememberName(id, name) {
  streamNames.set(id, name);
  if (streamNames.size > JOB_CACHE_LIMIT) streamNames.delete(streamNames.keys().next().value);
}

/** The cached {queue, step, task} of a job; starts a lookup if unknown. */
export function jobInfo(id) {
  const known = jobs.get(id);
  if (known) return known;
  jobs.set(id, { loading: true });
  lookups.push(id);
  pump();
  return jobs.get(id);
}

export function workflowName(id) {
  return streamName("workflow", id);
}

/** The name of a stream that is not a job, when known; else a lookup starts (a workflow
 * by GET /workflows/{id}, schedules by GET /schedules) and onJobInfo(fn) hears of it. */
export function streamName(kind, id) {
  const known = streamNames.get(id);
  if (known !== undefined || !id) return known;
  if (kind === "workflow" && !nameLookups.has(id)) {
    nameLookups.add(id);
    named(id, api(`/workflows/${encodeURIComponent(id)}`).then((workflow) => [[id, workflow.name]]));
  } else if (kind === "schedule" && performance.now() - schedulesReadAt > SCHEDULES_REREAD_MS) {
    schedulesReadAt = performance.now(); // a deleted schedule is not asked for again and again
    named(id, api("/schedules").then((body) => (body.items || []).map((item) => [item.id, item.name])));
  }
  return undefined;
}

function named(id, lookup) {
  lookup.then((pairs) => {
    for (const [streamId, name] of pairs) if (name) rememberName(streamId, name);
  }).catch(() => {}).finally(() => {
    for (const fn of jobSubscribers) fn(id);
  });
}

/** fn(jobId) whenever a lookup filled in a job's info. */
export function onJobInfo(fn) {
  jobSubscribers.add(fn);
  return () => jobSubscribers.delete(fn);
}

function pump() {
  while (lookupsInFlight < LOOKUP_CONCURRENCY && lookups.length) {
    const id = lookups.shift();
    lookupsInFlight += 1;
    api(`/jobs/${encodeURIComponent(id)}`)
      .then((job) => rememberJob(id, { queue: job.queue, step: job.step, task: job.task, loading: false }))
      .catch(() => rememberJob(id, { loading: false, missing: true }))
      .finally(() => {
        lookupsInFlight -= 1;
        for (const fn of jobSubscribers) fn(id);
        pump();
      });
  }
}
