"""What a task may see and reach: the shell's environment and limits, the addresses an http step may call.

An orchestrator that runs commands and HTTP calls on request must not hand
the worker's own secrets (QFORGE_DATABASE_URL with its password, the API
token) to a step whose output the API, the dashboard and the stream show, nor
let a step reach services that trust this machine's network position
(loopback, private networks, link-local, the cloud metadata address).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from dataclasses import dataclass
from typing import Mapping

from qforge.settings import Settings
from qforge.workers.isolation import Isolation

# What every shell step gets from the worker's environment, when set.
BASE_ENVIRONMENT = ("PATH", "HOME", "LANG", "TZ")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class TaskPolicy:
    """The limits of one worker's tasks (from QFORGE_SHELL_* and QFORGE_HTTP_ALLOW)."""

    shell_env_allow: tuple[str, ...] = ()
    shell_max_memory_mb: int | None = None
    shell_max_cpu_seconds: int | None = None
    http_allow: tuple[str, ...] = ()
    # Who runs shell steps, where (qforge.workers.isolation); None: as the worker's child, in its
    # folder (what a direct call of execute() gets; a worker with --allow-shell always has one).
    isolation: Isolation | None = None
    secrets_dir: str | None = None  # QFORGE_SECRETS_DIR

    @classmethod
    def from_settings(cls, settings: Settings, *, shell: bool = False) -> "TaskPolicy":
        """The worker's policy; with `shell`, shell steps run isolated (IsolationError if the
        settings ask for what this machine cannot give)."""
        return cls(tuple(settings.shell_env_names), settings.shell_max_memory_mb,
                   settings.shell_max_cpu_seconds, tuple(settings.http_allow_list),
                   Isolation.from_settings(settings) if shell else None, settings.secrets_dir)

    # --- shell

    def shell_environment(self, payload_env: Mapping[str, str],
                          worker_env: Mapping[str, str] | None = None) -> dict[str, str]:
        """PATH, HOME, LANG, TZ, the allowed names, then what the payload sets. Never a
        QFORGE_* variable of the worker (the settings refuse such names in the allow list)."""
        worker_env = os.environ if worker_env is None else worker_env
        env = {"PATH": DEFAULT_PATH}
        for name in (*BASE_ENVIRONMENT, *self.shell_env_allow):
            if name in worker_env and not name.upper().startswith("QFORGE_"):
                env[name] = worker_env[name]
        env.update(payload_env)
        return env

    def shell_argv(self, command: str) -> list[str]:
        """The argv that runs `command`. With limits, the shell sets them with its own
        `ulimit` and then execs a fresh shell for the command, which inherits them (the
        worker has threads, so no preexec_fn in the child)."""
        limits = []
        if self.shell_max_memory_mb is not None:
            limits.append(f"ulimit -v {self.shell_max_memory_mb * 1024}")
        if self.shell_max_cpu_seconds is not None:
            limits.append(f"ulimit -t {self.shell_max_cpu_seconds}")
        if not limits:
            return ["/bin/sh", "-c", command]
        prelude = " && ".join(limits)
        return ["/bin/sh", "-c", f'{prelude} || exit 126; exec /bin/sh -c "$1"', "sh", command]

    # --- http

    def allowed_networks(self) -> list[IPNetwork]:
        networks = []
        for entry in self.http_allow:
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                continue  # a host name, not a range
        return networks

    def allowed_hosts(self) -> frozenset[str]:
        names = set()
        for entry in self.http_allow:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                names.add(entry.lower().rstrip("."))
        return frozenset(names)

    def refusal(self, host: str, address: IPAddress) -> str | None:
        """Why an http step may not connect to `address` (resolved from `host`), or None."""
        if host.lower().rstrip(".") in self.allowed_hosts():
            return None
        if any(address in network for network in self.allowed_networks()):
            return None
        kind = address_kind(address)
        if kind is None:
            return None
        return (f"{host} resolves to {address}, a {kind} address; http steps may call only public"
                f" addresses unless QFORGE_HTTP_ALLOW lists the host or a range holding it")


def address_kind(address: IPAddress) -> str | None:
    """What makes an address non-public (None: a public address)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address_kind(address.ipv4_mapped)
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local (cloud metadata lives here)"
    if address.is_unspecified:
        return "unspecified"
    if address.is_multicast:
        return "multicast"
    if address.is_private:
        return "private"
    if address.is_reserved or not address.is_global:
        return "reserved"
    return None


async def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address `host` resolves to (an IP literal is itself)."""
    try:
        return [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    seen: list[IPAddress] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if address not in seen:
            seen.append(address)
    return seen
