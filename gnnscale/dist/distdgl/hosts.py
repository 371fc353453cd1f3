"""Which machines a DistDGL job runs on and which one this is: the ip_config file, this machine's
addresses, free ports, and the command each machine runs.

DistDGL finds a client's machine by matching the ip_config addresses against the machine's interfaces
(dgl/distributed/rpc_client.py); gnnscale finds its machine rank the same way, so the servers and
trainers it starts agree with DGL about which partition is local.
"""

from __future__ import annotations

import fcntl
import shlex
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

from gnnscale.errors import ConfigError

DGL_DEFAULT_PORT = 30050  # what DGL uses for an ip_config line without a port
TORCH_DEFAULT_PORT = 29500  # the trainers' rendezvous on machine 0 when several machines must agree on it
_SIOCGIFADDR = 0x8915


@dataclass(frozen=True)
class Machine:
    ip: str
    port: int  # the first DistDGL server's port; server s listens on port + s


def read_ip_config(path: str | Path) -> list[Machine]:
    """One machine per line: `IP [PORT]`; blank lines and # comments are skipped."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"dist.ip_config file '{path}' does not exist", "pass a file with one machine IP per line"
        )
    machines = []
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        try:
            socket.inet_aton(parts[0])
            port = int(parts[1]) if len(parts) == 2 else DGL_DEFAULT_PORT
            if len(parts) > 2 or not 0 < port < 65536:
                raise ValueError
        except (OSError, ValueError):
            raise ConfigError(
                f"dist.ip_config '{path}' line {n} is {raw.strip()!r}", "write `IPv4 [PORT]` on every line"
            ) from None
        machines.append(Machine(parts[0], port))
    if not machines:
        raise ConfigError(f"dist.ip_config '{path}' lists no machine", "write one machine IP per line")
    if len({m.ip for m in machines}) < len(machines):
        raise ConfigError(
            f"dist.ip_config '{path}' lists an address twice",
            "DistDGL runs one partition per machine: list each machine once",
        )
    return machines


def write_ip_config(path: Path, machines: list[Machine]) -> Path:
    """The file DGL reads (always with ports, so every process agrees on them)."""
    path.write_text("".join(f"{m.ip} {m.port}\n" for m in machines))
    return path


def local_addresses() -> dict[str, str]:
    """IPv4 address -> interface name of every interface of this machine (network namespace)."""
    found = {}
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:  # an interface without an IPv4 address
                continue
        found[socket.inet_ntoa(packed[20:24])] = name
    return found


def find_machine_rank(machines: list[Machine], given: int) -> int | None:
    """dist.machine_rank if given (>= 0), else the first ip_config line that is one of this machine's
    addresses (DGL's own rule); None when this machine is not listed."""
    if given >= 0:
        if given >= len(machines):
            raise ConfigError(
                f"dist.machine_rank={given} but dist.ip_config lists {len(machines)} machine(s)",
                f"use 0..{len(machines) - 1}, or -1 to find it from this machine's addresses",
            )
        mine = local_addresses()
        if machines[given].ip not in mine:  # DGL would take this machine for machine 0 and read its partition
            raise ConfigError(
                f"dist.machine_rank={given} is {machines[given].ip} in dist.ip_config, not an address of this "
                f"machine ({', '.join(sorted(mine)) or 'none'})",
                "run it on that machine, or leave dist.machine_rank unset to find it from the addresses",
            )
        return given
    mine = local_addresses()
    for rank, m in enumerate(machines):
        if m.ip in mine:
            return rank
    return None


def interface_of(ip: str) -> str | None:
    """The interface carrying `ip` here: gloo is told to use it (its default, the hostname's address, may
    not be reachable from the other machines)."""
    return local_addresses().get(ip)


def free_port(count: int = 1, host: str = "127.0.0.1") -> int:
    """A port p with p .. p+count-1 all free right now (servers listen on consecutive ports)."""
    for _ in range(64):
        with socket.socket() as s:
            s.bind((host, 0))
            base = s.getsockname()[1]
        if base + count < 65536 and all(_is_free(host, base + i) for i in range(count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports found on {host}")


def _is_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def machine_commands(
    overrides: list[str], ip_config: Path, part_config: Path, master_port: int, n: int
) -> list[str]:
    """The exact `gnnscale train` each machine runs: the user's overrides with the shared files pinned."""
    pinned = ("dist.ip_config=", "dist.part_config=", "dist.machine_rank=", "dist.master_port=", "dist=")
    keep = [o for o in overrides if not o.lstrip("+~").startswith(pinned)]
    common = ["dist=distdgl", f"dist.ip_config={ip_config}", f"dist.part_config={part_config}"]
    common += [f"dist.master_port={master_port}", *keep]
    return [shlex.join(["gnnscale", "train", *common, f"dist.machine_rank={i}"]) for i in range(n)]
