"""Test hosts in network namespaces made by the test itself (root only): a bridge, one veth per host.

Addresses live only inside namespaces this module creates (10.211.<net>.0/24) and the bridge, which is
linked to nothing else, so no traffic can leave the machine. Everything is removed on ``close``.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from dataclasses import dataclass, field


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=check)


def available() -> str | None:
    """None when namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    try:
        _ip("netns", "list")
    except (OSError, subprocess.CalledProcessError) as err:
        return f"iproute2 unusable: {err}"
    return None


@dataclass
class Hosts:
    count: int
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:5])
    net: int = 211

    def __post_init__(self) -> None:
        self.bridge = f"mbrt{self.tag}"
        self.names = [f"mbrt-{self.tag}-{i}" for i in range(self.count)]
        self.ips = [f"10.{self.net}.{int(self.tag, 16) % 250}.{i + 2}" for i in range(self.count)]
        self._veths = [f"mt{self.tag}{i}" for i in range(self.count)]
        prefix = ".".join(self.ips[0].split(".")[:3])
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{prefix}.1/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for name, ip, veth in zip(self.names, self.ips, self._veths):
                _ip("netns", "add", name)
                _ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
                _ip("link", "set", f"{veth}p", "netns", name)
                _ip("link", "set", veth, "master", self.bridge)
                _ip("link", "set", veth, "up")
                _ip("-n", name, "link", "set", "lo", "up")
                _ip("-n", name, "link", "set", f"{veth}p", "name", "eth0")
                _ip("-n", name, "addr", "add", f"{ip}/24", "dev", "eth0")
                _ip("-n", name, "link", "set", "eth0", "up")
        except Exception:
            self.close()
            raise

    def command(self, i: int, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.names[i], *argv]

    def cut(self, i: int) -> None:
        _ip("link", "set", self._veths[i], "down")

    def heal(self, i: int) -> None:
        _ip("link", "set", self._veths[i], "up")

    def close(self) -> None:
        for name, veth in zip(self.names, self._veths):
            _ip("link", "del", veth, check=False)
            _ip("netns", "del", name, check=False)
        _ip("link", "del", self.bridge, check=False)

    def leftovers(self) -> list[str]:
        links = _ip("-o", "link", "show", check=False).stdout
        spaces = _ip("netns", "list", check=False).stdout
        return [n for n in [self.bridge, *self._veths] if n in links] + [n for n in self.names if n in spaces]
