// A list kept current: read every POLL_MS, and soon after an event that may change it.

import { api, itemsOf } from "./api.js";
import { debounce, syncChildren } from "./dom.js";
import { subscribe } from "./live.js";

const POLL_MS = 2000;

/** Keep `body`'s rows (one per item of `path`'s list, built by `build`, keyed by `key`) current;
 * `empty` shows when there are none, `updated` says when they were read. Returns
 * { refresh, dispose }. */
export function pollRows({ path, name, body, empty, updated, key, build, changes }) {
  let disposed = false;

  async function refresh() {
    try {
      const items = itemsOf(await api(path), name);
      if (disposed) return;
      syncChildren(body, items, { key, signature: (item) => JSON.stringify(item), build });
      empty.hidden = items.length > 0;
      updated.textContent = `updated ${new Date().toLocaleTimeString()}`;
    } catch (error) {
      if (!disposed) updated.textContent = `could not refresh: ${error.message}`;
    }
  }

  const refreshSoon = debounce(refresh, 250);
  const unsubscribe = subscribe((event) => {
    if (changes(event)) refreshSoon();
  });
  refresh();
  const timer = setInterval(refresh, POLL_MS);
  return {
    refresh,
    dispose() {
      disposed = true;
      clearInterval(timer);
      refreshSoon.cancel();
      unsubscribe();
    },
  };
}
