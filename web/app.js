// The QForge dashboard: a hash router over a handful of views, one live event stream.

import { h } from "./js/dom.js";
import { onState, start as startStream } from "./js/live.js";
import { mountTimeline, startTimeline } from "./js/timeline.js";
import { mountSearch } from "./js/search.js";
import { mountJob } from "./js/job.js";
import { mountWorkflow } from "./js/workflow.js";
import { mountQueues } from "./js/queues.js";
import { mountWorkers } from "./js/workers.js";
import { mountSchedules } from "./js/schedules.js";
import { mountKeys } from "./js/keys.js";
import { mountOverview } from "./js/overview.js";
import { mountList } from "./js/lists.js";
import { mountNew } from "./js/forms.js";
import { mountDefinition, mountDefinitions } from "./js/definitions.js";
import { navigated } from "./js/crumbs.js";

// [pattern, nav section, mount(container, params, ...captures)]
const ROUTES = [
  [/^\/?$/, "timeline", (el, params) => mountTimeline(el, params)],
  [/^\/timeline$/, "timeline", (el, params) => mountTimeline(el, params)],
  [/^\/overview$/, "overview", (el) => mountOverview(el)],
  [/^\/jobs$/, "jobs", (el, params) => mountList(el, params, "jobs")],
  [/^\/workflows$/, "workflows", (el, params) => mountList(el, params, "workflows")],
  [/^\/new$/, "new", (el, params) => mountNew(el, params)],
  [/^\/search$/, "search", (el, params) => mountSearch(el, params)],
  [/^\/jobs\/([^/]+)$/, "jobs", (el, params, id) => mountJob(el, id)],
  [/^\/workflows\/([^/]+)$/, "workflows", (el, params, id) => mountWorkflow(el, id)],
  [/^\/queues$/, "queues", (el) => mountQueues(el)],
  [/^\/workers$/, "workers", (el) => mountWorkers(el)],
  [/^\/schedules$/, "schedules", (el) => mountSchedules(el)],
  [/^\/keys$/, "keys", (el) => mountKeys(el)],
  [/^\/definitions$/, "definitions", (el) => mountDefinitions(el)],
  [/^\/definitions\/([^/]+)$/, "definitions", (el, params, name) => mountDefinition(el, name)],
];

const main = document.getElementById("main");
let unmount = null;

function route(change) {
  navigated(change && change.oldURL);
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, search = ""] = hash.split("?");
  const params = new URLSearchParams(search);
  if (unmount) unmount();
  unmount = null;
  for (const [pattern, section, mount] of ROUTES) {
    const match = pattern.exec(path);
    if (!match) continue;
    for (const link of document.querySelectorAll("header nav a")) {
      link.classList.toggle("active", link.dataset.section === section);
      if (link.dataset.section === section) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
    const captures = match.slice(1).map(decodeURIComponent);
    unmount = mount(main, params, ...captures) || null;
    document.title = `QForge · ${section[0].toUpperCase()}${section.slice(1)}`;
    main.focus({ preventScroll: true });
    window.scrollTo(0, 0);
    return;
  }
  main.replaceChildren(h("div", { class: "empty" }, "Nothing here. ", h("a", { href: "#/timeline" }, "Back to the timeline")));
}

const LIVE_TEXT = { live: "live", connecting: "connecting…", reconnecting: "reconnecting…" };

onState((state) => {
  const indicator = document.getElementById("live");
  indicator.dataset.state = state;
  indicator.querySelector(".text").textContent = LIVE_TEXT[state] ?? state;
  indicator.title = state === "live"
    ? "Receiving events from /events/stream"
    : "The event stream is down; it reconnects on its own and resumes where it stopped";
});

startTimeline();
startStream();
window.addEventListener("hashchange", route);
route();
