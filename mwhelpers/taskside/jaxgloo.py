"""JAX's gloo collectives on the address TF_CONFIG names for this task, not on the machine's name.

With ``JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo`` (mwhelpers sets it for every training task)
JAX makes its CPU collectives with ``make_gloo_tcp_collectives(client)`` and no host: gloo
then listens on, and tells its peers, the first address that ``gethostname()`` resolves to.
On many machines that is loopback (Debian's ``127.0.1.1 NAME`` line in ``/etc/hosts``; on
the test hosts, namespaces of one machine, ``127.0.0.1``), so the processes on other hosts
are told to connect to 127.0.0.1: each one's connection is refused (the coordinator's, on
the right address, works), and process 0 fails after gloo's timeout while the others wait
(measured on the SSH test hosts: ``Gloo context initialization failed: ... timed out
connecting: SO_ERROR: Connection refused, remote=[127.0.0.1]:PORT``). JAX has no setting
for gloo's host.

So, once ``jax._src.xla_bridge`` is imported, a gloo made without a host or interface is
made with ``hostname=`` this task's host in ``KERAS_DISTRIBUTION_JOB_ADDRESSES`` (at
``KERAS_DISTRIBUTION_PROCESS_ID``: the address the kernel reached this host at, which the
other hosts reach too); one line in the log says so. A host or interface the program passes
itself is kept.  Nothing happens without those variables, with another collectives
implementation, or with ``MWHELPERS_JAX_GLOO_HOST=0``; ``MWHELPERS_JAX_GLOO_HOST=ADDR``
names the address instead.  Where gloo cannot listen on it, JAX raises at its first
collective (``Unable to find address for: ADDR``), as without this.

Loaded by path in a task's start-up (``_bootstrap.py``): standard library only.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Mapping
from types import ModuleType

ENV = "MWHELPERS_JAX_GLOO_HOST"
XLA_BRIDGE = "jax._src.xla_bridge"
MAKE = "make_gloo_tcp_collectives"
NOTICE = ("[mwhelpers] JAX's gloo collectives listen on {host} (this task's address in "
          "KERAS_DISTRIBUTION_JOB_ADDRESSES), not on the address this machine's name resolves "
          "to (keep JAX's own choice: MWHELPERS_JAX_GLOO_HOST=0)")
_OFF = ("0", "false", "no", "off")


def gloo_host(environ: Mapping[str, str]) -> str | None:
    """The host gloo should listen on for this task, or None to leave JAX's choice."""
    chosen = environ.get(ENV, "").strip()
    if chosen.lower() in _OFF:
        return None
    if environ.get("JAX_CPU_COLLECTIVES_IMPLEMENTATION", "").strip().lower() != "gloo":
        return None
    if chosen:
        return chosen
    addresses = [a.strip() for a in environ.get("KERAS_DISTRIBUTION_JOB_ADDRESSES", "").split(",")
                 if a.strip()]
    try:
        mine = addresses[int(environ.get("KERAS_DISTRIBUTION_PROCESS_ID", ""))]
    except (ValueError, IndexError):
        return None
    host = mine.rsplit(":", 1)[0] if ":" in mine else mine
    return host.strip("[]") or None  # an IPv6 address comes as [addr]:port


def _patch(module: ModuleType) -> None:
    jaxlib = getattr(module, "_jax", None)
    make = getattr(jaxlib, MAKE, None)
    if make is None or getattr(make, "__wrapped__", None) is not None:
        return  # another JAX, or already done

    @functools.wraps(make)
    def make_gloo(distributed_client: object, hostname: str | None = None,
                  interface: str | None = None) -> object:
        # Read now, not when JAX was imported: a task forked from the warm-start server, which
        # may have imported JAX, gets its environment later.
        host = gloo_host(os.environ)
        if host is not None and hostname is None and interface is None:
            hostname = host
            print(NOTICE.format(host=host), file=sys.stderr, flush=True)
        return make(distributed_client, hostname=hostname, interface=interface)

    setattr(jaxlib, MAKE, make_gloo)


def install(after_import: Callable[[str, Callable[[ModuleType], object]], None]) -> None:
    """Arrange for JAX's gloo to listen on this task's address once JAX loads (see the
    module); what to do is decided then, from the task's environment."""
    after_import(XLA_BRIDGE, _patch)
