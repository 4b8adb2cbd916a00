"""The browser cannot ride on localhost: Host, Origin and Content-Type checked before any route.

A web page the developer visits can reach an API on 127.0.0.1 in two ways that
need no token while none exists (every caller is then an anonymous admin):
- DNS rebinding: its own name, re-pointed at 127.0.0.1, makes the page same-origin
  with the API. Its requests still carry `Host: attacker.example`, so a request
  whose Host is not one of QFORGE_ALLOWED_HOSTS gets 400.
- A cross-site write (a form, or fetch(..., {mode: "no-cors"})) with a `text/plain`
  body: the browser sends it without asking first, with `Origin: https://attacker`.
  A write whose Origin is not the host it was sent to gets 403, and a write whose
  body is not `application/json` gets 415 (a browser must ask the server, by a
  CORS preflight this API never grants, before it sends JSON cross-site).
Clients that are not browsers (curl, qforge.Client) send no Origin and are unaffected.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from qforge.api.asgi import HttpMiddleware
from qforge.api.errors import error_response

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Liveness answers whatever the Host: load balancers and Kubernetes probes address a pod by
# its IP, and /healthz tells nothing a rebinding page could use.
ANY_HOST_PATHS = frozenset({"/healthz"})
DEFAULT_HOSTS = ("localhost", "127.0.0.1", "[::1]")
DEFAULT_PORTS = {"http": "80", "https": "443", "ws": "80", "wss": "443"}
JSON_TYPES = ("application/json",)


def allowed_hosts(setting: str, bound_host: str | None) -> frozenset[str]:
    """The host names a request may name in Host: QFORGE_ALLOWED_HOSTS (comma-separated; `*`
    allows any, `.example.com` that domain and its subdomains) or, when it is empty, the
    address the API is bound to, `localhost`, `127.0.0.1` and `[::1]`."""
    names = [name.strip().lower() for name in setting.split(",") if name.strip()]
    if not names:
        names = list(DEFAULT_HOSTS)
        if bound_host:
            names.append(_bracketed(bound_host.lower()))
    return frozenset(_bracketed(name) for name in names)


def _bracketed(host: str) -> str:
    """An IPv6 literal as Host carries it ([::1]), everything else as it is."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def split_authority(authority: str) -> tuple[str, str | None]:
    """'Example.com:8090' -> ('example.com', '8090'); '[::1]:80' -> ('[::1]', '80')."""
    authority = authority.strip().lower()
    if authority.startswith("["):
        host, _, rest = authority.partition("]")
        host += "]"
        port = rest[1:] if rest.startswith(":") else None
        return host, port or None
    host, sep, port = authority.rpartition(":")
    if not sep:
        return authority, None
    return host, port or None


def host_allowed(host: str, allowed: frozenset[str]) -> bool:
    if "*" in allowed or host in allowed:
        return True
    return any(name.startswith(".") and (host.endswith(name) or host == name[1:]) for name in allowed)


def _normal(host: str, port: str | None, scheme: str | None) -> tuple[str, str | None]:
    """Drop a port that is the scheme's default (Host has no scheme: 80 and 443 both are)."""
    defaults = {DEFAULT_PORTS[scheme]} if scheme in DEFAULT_PORTS else {"80", "443"}
    return host, None if port in defaults else port


def same_origin(origin: str, host_header: str) -> bool:
    """Does the Origin header name the authority the request was sent to (its Host)?"""
    parts = urlsplit(origin.strip())
    if parts.scheme not in DEFAULT_PORTS or not parts.netloc or "@" in parts.netloc:
        return False  # "null" (a sandboxed frame, a file: page), or not an origin at all
    origin_host, origin_port = split_authority(parts.netloc)
    request_host, request_port = split_authority(host_header)
    return _normal(origin_host, origin_port, parts.scheme) == _normal(request_host, request_port, None)


def is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media in JSON_TYPES or (media.startswith("application/") and media.endswith("+json"))


class BrowserGuard(HttpMiddleware):
    """ASGI middleware: 400 for a Host that is not allowed, 403 for a write from a foreign Origin,
    415 for a write whose body is not JSON. Each a contract §3 error body naming the setting."""

    def __init__(self, app: ASGIApp, hosts: frozenset[str]):
        super().__init__(app)
        self.hosts = hosts

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = self.refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, code, message, details = refusal
        await error_response(status, code, message, details)(scope, receive, send)

    def refusal(self, scope: Scope) -> tuple[int, str, str, list] | None:
        headers: dict[bytes, bytes] = {}
        for name, value in scope.get("headers") or []:
            headers.setdefault(name, value)  # the first of a repeated header
        host_header = headers.get(b"host", b"").decode("latin-1")
        host, _ = split_authority(host_header)
        if scope.get("path") not in ANY_HOST_PATHS and not host_allowed(host, self.hosts):
            shown = host_header[:100] or "(none)"
            return (400, "host_not_allowed",
                    f"Host {shown!r} is not one of this API's hosts (QFORGE_ALLOWED_HOSTS:"
                    f" {', '.join(sorted(self.hosts))})",
                    [{"field": "Host", "in": "header", "limit": "QFORGE_ALLOWED_HOSTS"}])
        if scope["method"] in SAFE_METHODS:
            return None
        origin = headers.get(b"origin")
        if origin is not None and not same_origin(origin.decode("latin-1"), host_header):
            return (403, "foreign_origin",
                    f"a write from Origin {origin.decode('latin-1')[:100]!r} to {host_header[:100]!r}"
                    " is refused: only pages this API serves may write to it",
                    [{"field": "Origin", "in": "header"}])
        content_type = headers.get(b"content-type")
        has_body = headers.get(b"content-length", b"0") not in (b"0", b"") or b"transfer-encoding" in headers
        if (content_type is not None and not is_json(content_type.decode("latin-1"))) or \
                (content_type is None and has_body):
            got = content_type.decode("latin-1")[:100] if content_type is not None else "none"
            return (415, "unsupported_media_type",
                    f"a write's body must be JSON: send Content-Type: application/json (got {got!r})",
                    [{"field": "Content-Type", "in": "header"}])
        return None
