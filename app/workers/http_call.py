"""The built-in http task: one call (and its redirects), every address checked against the policy and pinned."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from qforge.workers.payloads import OUTPUT_TAIL_BYTES, message_tail, payload_seconds
from qforge.workers.sandbox import TaskPolicy, resolve
from qforge.workers.secrets import Masker, resolve_references
from qforge.workers.tasks import TaskError

HTTP_DEFAULT_TIMEOUT_SECONDS = 300.0  # a Lambda-style call may be slow; the job timeout still applies
HTTP_MAX_RESPONSE_BYTES = 1024 * 1024  # a result lands in the event log; keep it like the API's body limit
HTTP_MAX_REDIRECTS = 10  # each hop's address is checked like the first


async def run_http(payload: dict, policy: TaskPolicy | None = None, masker: Masker | None = None) -> Any:
    """Call the URL; every address it (and each redirect) resolves to is checked against
    `policy` (no loopback, private, link-local... unless QFORGE_HTTP_ALLOW allows it), and
    the connection goes to the address that was checked, so a second DNS answer cannot
    swap it (TLS still verifies the host name, sent as SNI)."""
    policy = policy or TaskPolicy()
    url = payload.get("url")
    if not isinstance(url, str):
        raise TaskError("an http payload needs a string 'url'")
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise TaskError(f"http 'url' is not a valid URL: {exc}") from exc
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise TaskError(f"http 'url' must be an absolute http:// or https:// URL, got {url!r}")
    method = payload.get("method") or ("POST" if "json" in payload else "GET")
    if not isinstance(method, str) or not method.isalpha():
        raise TaskError(f"http 'method' must be a method name such as GET or POST, got {method!r}")
    method = method.upper()
    payload = resolve_references(payload, "headers", policy.secrets_dir, masker if masker is not None else Masker())
    headers = payload.get("headers") or {}
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise TaskError("http 'headers' must be an object of string values (or {\"secret\": NAME})")
    timeout_seconds = payload_seconds(payload, "timeout_seconds") or HTTP_DEFAULT_TIMEOUT_SECONDS
    body_argument = {"json": payload["json"]} if "json" in payload else {}

    try:
        # httpx's timeout is per read or write; asyncio.timeout bounds the whole exchange.
        async with asyncio.timeout(timeout_seconds):
            async with httpx.AsyncClient(timeout=timeout_seconds, follow_redirects=False) as client:
                response, body, complete = await _exchange(client, policy, method, parsed, headers,
                                                           body_argument)
    except (TimeoutError, httpx.TimeoutException) as exc:
        raise TaskError(f"{method} {url} timed out after {timeout_seconds:g}s", reason="timeout") from exc
    except httpx.HTTPError as exc:
        raise TaskError(f"{method} {url} failed: {type(exc).__name__}: {exc}") from exc

    text = _decode(body, response)
    if not response.is_success:
        raise TaskError(
            f"{method} {url} returned HTTP {response.status_code}: {message_tail(text)}",
            result={"status_code": response.status_code, "body": text[-OUTPUT_TAIL_BYTES:]},
        )
    if not complete:
        raise TaskError(f"{method} {url} returned more than {HTTP_MAX_RESPONSE_BYTES} bytes")
    content_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json" or content_type.endswith("+json"):
        try:
            return json.loads(text) if text.strip() else None
        except ValueError:
            pass  # a service that mislabels its text still succeeded; keep the text
    return text


async def _exchange(client: httpx.AsyncClient, policy: TaskPolicy, method: str, url: httpx.URL,
                    headers: dict[str, str], body_argument: dict) -> tuple[httpx.Response, bytes, bool]:
    """Send, following up to HTTP_MAX_REDIRECTS redirects ourselves, each hop checked."""
    for _ in range(HTTP_MAX_REDIRECTS + 1):
        request = await _checked_request(client, policy, method, url, headers, body_argument)
        response = await client.send(request, stream=True)
        if not response.is_redirect:
            try:
                body, complete = await _read_bounded(response)
            finally:
                await response.aclose()
            return response, body, complete
        await response.aclose()
        try:
            next_url = url.join(response.headers["location"])
        except httpx.InvalidURL as exc:
            raise TaskError(f"{method} {url} redirected to an invalid URL: {exc}") from exc
        if next_url.scheme not in ("http", "https") or not next_url.host:
            raise TaskError(f"{method} {url} redirected to {next_url}, which is not an http(s) URL")
        # As browsers and httpx do: 303 (and 301/302 after a POST) go on with a GET
        # and no body; 307 and 308 repeat the request as it was.
        if (response.status_code == 303 and method != "HEAD") or (
                response.status_code in (301, 302) and method == "POST"):
            method, body_argument = "GET", {}
        if next_url.host != url.host:  # credentials meant for one host never go to another
            headers = {k: v for k, v in headers.items() if k.lower() not in ("authorization", "cookie")}
        url = next_url
    raise TaskError(f"{method} {url}: more than {HTTP_MAX_REDIRECTS} redirects")


async def _checked_request(client: httpx.AsyncClient, policy: TaskPolicy, method: str, url: httpx.URL,
                           headers: dict[str, str], body_argument: dict) -> httpx.Request:
    """A request to an address of url's host that the policy allows, every address checked."""
    host = url.host
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        addresses = await resolve(host, port)
    except OSError as exc:
        raise TaskError(f"{method} {url} failed: cannot resolve {host}: {exc}") from exc
    for address in addresses:
        refusal = policy.refusal(host, address)
        if refusal is not None:
            raise TaskError(f"{method} {url} refused: {refusal}", reason="refused")
    pinned = url.copy_with(host=str(addresses[0]))
    sent = {k: v for k, v in headers.items() if k.lower() != "host"}
    sent["Host"] = url.netloc.decode("ascii")
    extensions = {}
    if url.scheme == "https" and str(addresses[0]) != host.strip("[]"):
        extensions["sni_hostname"] = host  # certificate checked against the name, not the address
    return client.build_request(method, pinned, headers=sent, extensions=extensions, **body_argument)


async def _read_bounded(response: httpx.Response) -> tuple[bytes, bool]:
    """At most HTTP_MAX_RESPONSE_BYTES of the body, and whether that was all of it."""
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > HTTP_MAX_RESPONSE_BYTES:
            return bytes(body[:HTTP_MAX_RESPONSE_BYTES]), False
    return bytes(body), True


def _decode(body: bytes, response: httpx.Response) -> str:
    try:
        return body.decode(response.charset_encoding or "utf-8", errors="replace")
    except LookupError:  # a charset Python does not know
        return body.decode("utf-8", errors="replace")

