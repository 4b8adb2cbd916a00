// Breadcrumbs that follow where the reader came from: a job reached from the Jobs list says
// "Jobs / job", from a workflow "Workflows / <its name> / job", from search "Search / job".

import { h } from "./dom.js";
import { workflowName } from "./live.js";

const SECTIONS = {
  timeline: "Timeline", overview: "Overview", jobs: "Jobs", workflows: "Workflows", search: "Search",
  queues: "Queues", workers: "Workers", schedules: "Schedules", new: "New",
};
let previous = null; // the hash of the page before this one ("#/jobs?status=dead")

/** app.js calls this on every route change with the URL that was left. */
export function navigated(oldUrl) {
  const hash = oldUrl ? new URL(oldUrl).hash : "";
  previous = hash && hash !== location.hash ? hash : previous;
}

function trailOf(hash) {
  const [path] = hash.replace(/^#\/?/, "").split("?");
  const [first, id] = path.split("/");
  const section = first || "timeline";
  if (!SECTIONS[section]) return null;
  const list = h("a", { href: id ? `#/${section}` : hash }, SECTIONS[section]); // a list keeps its filters
  if (!id) return [list];
  const label = section === "workflows" ? (workflowName(decodeURIComponent(id)) ?? "workflow") : section.replace(/s$/, "");
  return [list, " / ", h("a", { href: hash }, label)];
}

/** The crumbs of a detail page: where the reader came from, then `here` ("job", "workflow"). */
export function crumbs(here, { fallback }) {
  const came = previous && !previous.endsWith(location.hash) ? trailOf(previous) : null;
  const trail = came || [h("a", { href: `#/${fallback}` }, SECTIONS[fallback])];
  return h("nav", { class: "crumbs", "aria-label": "Breadcrumbs" }, trail, ` / ${here}`);
}
