"""What an import needs from its environment: the network, a writable home.

While a guard is active, an audit hook (PEP 578) records every attempt to resolve or connect to a
host other than this machine and *refuses* it (the import sees an offline host, wherever the probe
runs: an air-gapped user's view), and records files created under the home directory. The contract
level turns these into caveats ("works, but fetches X at import"), not verdicts.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from dataclasses import dataclass, field

BLOCKED = "envbuild-probe: network blocked at import"
_LOOPBACK = ("localhost", "127.", "::1", "0.0.0.0")
_WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND


@dataclass
class Needs:
    network: list[str] = field(default_factory=list)  # hosts / URLs it tried to reach
    home: list[str] = field(default_factory=list)  # paths it wrote under $HOME

    def add(self, kind: str, what: str) -> None:
        lst = self.network if kind == "network" else self.home
        if what not in lst and len(lst) < 20:
            lst.append(what)


_active: Needs | None = None
_owner: int | None = None  # the thread whose imports are guarded (other threads run freely)
_installed = False
_home = ""


def _local(host) -> bool:
    h = host.decode() if isinstance(host, bytes) else str(host or "")
    return not h or h.startswith(_LOOPBACK) or h.startswith(("/", "\0"))  # AF_UNIX paths are local


def _hook(event: str, args) -> None:
    needs = _active
    if needs is None or threading.get_ident() != _owner:
        return
    if event == "socket.getaddrinfo":
        host, port = args[0], args[1]
        if not _local(host):
            what = f"{host.decode() if isinstance(host, bytes) else host}:{port}"
            needs.add("network", what)
            raise socket.gaierror(socket.EAI_AGAIN, f"{BLOCKED}: Temporary failure in name resolution ({what})")
    elif event == "socket.connect":
        addr = args[1]
        host = addr[0] if isinstance(addr, tuple) else addr
        if not _local(host):
            what = f"{host}:{addr[1]}" if isinstance(addr, tuple) and len(addr) > 1 else str(host)
            needs.add("network", what)
            raise ConnectionRefusedError(111, f"{BLOCKED}: connect to {what}")
    elif event == "urllib.Request":
        needs.add("network", str(args[0]))
    elif event == "http.client.connect":
        if not _local(args[1]):
            needs.add("network", f"{args[1]}:{args[2]}")
    elif event == "open" and _home:
        path, mode, flags = args[0], args[1], args[2]
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
            (isinstance(flags, int) and flags & _WRITE)
        if writes and isinstance(path, str) and path.startswith(_home):
            needs.add("home", "~" + path[len(_home) - 1:])
    elif event == "os.mkdir" and _home:
        path = args[0]
        if isinstance(path, str) and path.startswith(_home):
            needs.add("home", "~" + path[len(_home) - 1:])


class guard:
    """`with guard() as needs:` — record (and refuse) network use, record writes under $HOME."""

    def __enter__(self) -> Needs:
        global _active, _owner, _installed, _home
        if not _installed:
            sys.addaudithook(_hook)  # cannot be removed: it is a no-op while no guard is active
            _installed = True
        home = os.path.expanduser("~")
        _home = home.rstrip("/") + "/" if home not in ("", "/", "~") else ""
        self.prev = (_active, _owner)
        _active, _owner = Needs(), threading.get_ident()
        return _active

    def __exit__(self, *exc) -> None:
        global _active, _owner
        _active, _owner = self.prev
