"""Where the ray engine joins a cluster: checked before ``ray.init``.

``ray.init`` retries an address where no Ray cluster answers for minutes,
saying only Ray's own warnings, and heeds neither ``--timeout`` nor a stop
signal meanwhile. So the engine first asks, within ``--timeout``, whether a
Ray cluster answers where ``ray.init`` would go (``--address``, or Ray's
``RAY_ADDRESS`` without it; ``auto`` and a local host resolved as Ray
resolves them; a ``ray://`` client address as given):

- a TCP connect: refused, no answer or no such host is no cluster;
- then the first words of gRPC, which Ray's GCS and its client server
  speak: HTTP/2's connection preface and an empty SETTINGS frame, to
  which every HTTP/2 server answers with a SETTINGS frame of its own. A
  port that accepts but answers otherwise or not at all (Ray's dashboard,
  8265, is HTTP/1.1; a database; a port nothing reads) is no cluster
  either. Where Ray runs with TLS (``RAY_USE_TLS``), the TCP connect only.

Either way the run ends with one line that says where it looked and what
to change (``ConfigError``).
"""
from __future__ import annotations

import os
import socket
import time

from ...errors import ConfigError

# HTTP/2's client connection preface, then an empty SETTINGS frame (RFC 9113, 3.4 and 6.5)
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
SETTINGS = 4  # a frame's type, its header's fourth byte


def check_address(address: str | None, timeout: float) -> None:
    """Refuses in one line, within about ``timeout`` seconds, an
    ``address`` (else ``RAY_ADDRESS``) where no Ray cluster answers (see
    the module doc); nothing to check where neither is given."""
    named = f"--address {address}"
    if not address:
        address = os.environ.get("RAY_ADDRESS")
        if not address:
            return  # ray.init starts a new local instance
        named = f"RAY_ADDRESS={address} (Ray's variable, set in the environment)"
    from ray._private.services import canonicalize_bootstrap_address

    fix = "fix --address, or omit --address" if named.startswith("--") else \
        "fix or unset RAY_ADDRESS"
    try:
        target = (address.split("://", 1)[1] if "://" in address
                  else canonicalize_bootstrap_address(address))
        if target is None:  # "local": ray.init starts a new instance here
            return
        host, _, port = target.rpartition(":")
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as sock:
            tls = os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true")
            grpc = tls or speaks_http2(sock, timeout)
    except (OSError, ValueError) as exc:  # refused, no answer, no such host, no cluster found
        why = getattr(exc, "strerror", None) or str(exc).split(".")[0]
        raise ConfigError(f"no Ray cluster answered at {named} within {timeout:g} s "
                          f"({why}): start one with `ray start --head` and pass its address, "
                          f"{fix} for a local Ray instance") from exc
    if not grpc:
        raise ConfigError(f"something answers at {named} but it is no Ray cluster (it does not "
                          f"speak gRPC, as Ray's GCS does, within {timeout:g} s): give the port "
                          "`ray start --head --port` took (6379 unless set; the dashboard's "
                          f"8265 is not it), {fix} for a local Ray instance")


def speaks_http2(sock: socket.socket, timeout: float) -> bool:
    """Whether the server on ``sock`` answers HTTP/2's preface with a
    SETTINGS frame within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    sock.sendall(PREFACE)
    head = b""
    while len(head) < 9:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        sock.settimeout(left)
        try:
            got = sock.recv(9 - len(head))
        except socket.timeout:
            return False
        if not got:  # closed: an HTTP/1 server's answer to a request it cannot read
            return False
        head += got
    return head[3] == SETTINGS
