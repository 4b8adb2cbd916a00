// Talking to the QForge API: JSON fetches, errors, and the API token.
//
// When QFORGE_API_TOKEN is set on the server every route answers 401 without
// it. The first 401 opens a small form (once, however many requests are
// waiting); the token is kept in sessionStorage for this tab's session and
// sent as `Authorization: Bearer`. The stream (EventSource cannot set headers)
// gets a short-lived ticket instead (live.js): the token never goes into a URL.

import { h } from "./dom.js";

const TOKEN_KEY = "qforge.token";

export class ApiError extends Error {
  constructor(status, body) {
    const message = body && typeof body === "object" && body.message
      ? body.message
      : `HTTP ${status}`;
    super(message);
    this.status = status;
    this.body = body;
  }
}

export function getToken() {
  return sessionStorage.getItem(TOKEN_KEY);
}

let pendingTokenForm = null;

/** Resolves once the user has entered a token (one form for all callers). */
export function askForToken(rejected) {
  if (!pendingTokenForm) {
    pendingTokenForm = showTokenForm(rejected).then((token) => {
      sessionStorage.setItem(TOKEN_KEY, token);
      pendingTokenForm = null;
      window.dispatchEvent(new Event("qforge:token"));
      return token;
    });
  }
  return pendingTokenForm;
}

function showTokenForm(rejected) {
  return new Promise((resolve) => {
    const input = h("input", {
      type: "password", name: "token", autocomplete: "off", required: true,
      placeholder: "API token", "aria-label": "API token",
    });
    const form = h("form", { class: "token-form" },
      h("h2", null, "API token required"),
      h("p", null, rejected
        ? "The server rejected that token (unknown or revoked). Enter another."
        : "This QForge API needs a token (`qforge token create NAME --scope read`)."
          + " It is kept for this browser tab's session only."),
      input,
      h("div", { class: "actions" }, h("button", { type: "submit", class: "btn primary" }, "Continue")));
    const overlay = h("div", { class: "overlay", id: "token-overlay" }, form);
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const token = input.value.trim();
      if (!token) return;
      overlay.remove();
      resolve(token);
    });
    document.body.append(overlay);
    input.focus();
  });
}

/** fetch() a JSON route; returns the parsed body or throws ApiError. */
export async function api(path, { method = "GET", body } = {}) {
  for (;;) {
    const token = getToken();
    const headers = { Accept: "application/json" };
    if (token) headers.Authorization = `Bearer ${token}`;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(path, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (response.status === 401) {
      await askForToken(Boolean(token));
      continue;
    }
    const text = await response.text();
    let data = null;
    if (text) {
      try {
        data = JSON.parse(text);
      } catch {
        data = text;
      }
    }
    if (!response.ok) throw new ApiError(response.status, data);
    return data;
  }
}

/** A list route's items, whatever the envelope (`{items}` or a bare array). */
export function itemsOf(body, ...keys) {
  if (Array.isArray(body)) return body;
  if (!body || typeof body !== "object") return [];
  for (const key of ["items", ...keys]) {
    if (Array.isArray(body[key])) return body[key];
  }
  return [];
}

export function query(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value == null || value === "") continue;
    for (const item of Array.isArray(value) ? value : [value]) search.append(key, item);
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}
