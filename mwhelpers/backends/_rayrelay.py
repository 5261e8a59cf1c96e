"""The Ray backend's helper process, run by path on the kernel's machine with the kernel's Python
(which has Ray): ``python _rayrelay.py hold|run [OPTIONS] [-- ARGV...]``.

``hold`` connects to the Ray cluster, makes the cluster's placement group (one bundle per task,
named, spread or packed), prints one JSON line (``{"nodes": [...]}``: each bundle's node
address, or ``{"error": ...}``) and holds the group until its standard input ends (the kernel
closed the cluster, or died).  Ray then removes the group, and with it every actor placed in it.

``run`` is the transport of one command on one bundle's node, as ``ssh HOST`` is for the ssh
backend: an actor placed in the bundle starts ARGV there as a process of its own, and this
process relays its standard input to that process and the process's standard output and error
back, until it ends; its exit code is this process's.  ``{python}`` as ARGV's first word is the
Python that runs Ray on that node.  When this process ends (the kernel closed the connection,
killed it, or died), Ray ends the actor, the command's standard input reaches its end, and the
mwhelpers agent that it runs ends its task.

Run by path, never imported as part of mwhelpers: Ray sends the actor's class by value from
``__main__``, so the nodes need Ray and Python, not mwhelpers.
"""

import argparse
import json
import logging
import os
import queue
import subprocess
import sys
import threading
from typing import IO, Any

import ray
from ray.util.placement_group import get_placement_group, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

# What the actor runs, with the command after it: the command in a session of its own, waited
# for.  When Ray ends the actor it kills the actor's children and its process group: this waiter
# then, not the command, which sees its input end (the actor held it) and ends as over a dropped
# SSH connection: the mwhelpers agent ends its task's whole group first.  The command gets
# every signal's default (a Ray worker's thread blocks some, and its children would inherit it).
WAITER = ("import signal, subprocess, sys\n"
          "signal.pthread_sigmask(signal.SIG_SETMASK, ())\n"
          "for sig in signal.valid_signals():\n"
          "    if sig in (signal.SIGINT, signal.SIGTERM) or signal.getsignal(sig) == signal.SIG_IGN:\n"
          "        try:\n"
          "            signal.signal(sig, signal.SIG_DFL)\n"
          "        except (OSError, ValueError):\n"
          "            pass\n"
          "code = subprocess.Popen(sys.argv[1:], start_new_session=True).wait()\n"
          "sys.exit(code if code >= 0 else 128 - code)\n")
# Not passed on to the command: Ray's settings of its own worker processes (a program that
# uses Ray itself would take it for one of them).
NOT_PASSED = ("OMP_NUM_THREADS",)


def connect(args: argparse.Namespace) -> None:
    ray.init(address=args.address, namespace=args.namespace, logging_level=logging.ERROR,
             log_to_driver=False, configure_logging=False)


def token_sent() -> bool:
    """Whether this driver sends a token: where it does not, and the cluster let it in, the
    cluster takes anyone's code.  (Ray's own answer, from 2.52; else what its variable says.)"""
    try:
        from ray._private.authentication.authentication_utils import is_token_auth_enabled

        return bool(is_token_auth_enabled())
    except Exception:
        return os.environ.get("RAY_AUTH_MODE", "").strip().lower() == "token"


def hold(args: argparse.Namespace) -> int:
    try:
        connect(args)
        bundle = {"CPU": args.cpus, **({"GPU": args.gpus} if args.gpus else {})}
        group = placement_group([dict(bundle) for _ in range(args.bundles)],
                                strategy=args.strategy, name=args.name)
        ready = group.ready()
        done, _ = ray.wait([ready], timeout=args.timeout)
        if not done:
            total = ray.cluster_resources()
            free = ray.available_resources()
            print(json.dumps({"error": (
                f"Ray could not place {args.bundles} bundles of {bundle} ({args.strategy}) within "
                f"{args.timeout:g} s: the cluster has {len(ray.nodes())} node(s), "
                f"{total.get('CPU', 0):g} CPUs ({free.get('CPU', 0):g} free) and "
                f"{total.get('GPU', 0):g} GPUs ({free.get('GPU', 0):g} free)")}), flush=True)
            remove_placement_group(group)
            return 1
        table = ray.util.placement_group_table(group)
        addresses = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        nodes = [addresses.get(table["bundles_to_node_id"][i], "?") for i in range(args.bundles)]
        print(json.dumps({"nodes": nodes, "token_sent": token_sent()}), flush=True)
    except Exception as e:  # said in the kernel, which reads this line
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
        return 1
    while sys.stdin.buffer.read(65536):  # until the kernel closes it, or dies
        pass
    remove_placement_group(group)
    return 0


class Relay:
    """One command on this node: started, fed, read and waited for (an actor of its own, with
    threads enough to do all four at once)."""

    proc: "subprocess.Popen[bytes]"

    def start(self, argv: list[str], cwd: str) -> tuple[str, int]:
        if argv[:1] == ["{python}"]:  # (mwhelpers.taskside.wire.THIS_PYTHON)
            argv = [sys.executable, *argv[1:]]
        env = {k: v for k, v in os.environ.items()
               if k not in NOT_PASSED and not k.startswith("RAY_")}
        self.proc = subprocess.Popen([sys.executable, "-c", WAITER, *argv],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env,
                                     cwd=cwd if cwd and os.path.isdir(cwd) else None)
        return str(ray.util.get_node_ip_address()), self.proc.pid

    def write(self, data: bytes) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        try:
            if data:
                stdin.write(data)
                stdin.flush()
            else:
                stdin.close()
        except (OSError, ValueError):
            pass

    def read(self, which: str) -> Any:  # a generator: Ray streams what it yields
        pipe = self.proc.stdout if which == "out" else self.proc.stderr
        assert pipe is not None
        fd = pipe.fileno()
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                return
            yield chunk

    def wait(self) -> int:
        return self.proc.wait()


def run(args: argparse.Namespace, argv: list[str]) -> int:
    # The input is read at once, and kept until the command runs: the kernel's first line (the
    # agent's header, with the files it writes) is larger than a pipe holds.
    given: queue.Queue[bytes] = queue.Queue()

    def take() -> None:
        try:
            while True:
                data = os.read(0, 65536)
                given.put(data)
                if not data:
                    return
        except OSError:
            given.put(b"")

    threading.Thread(target=take, daemon=True).start()
    connect(args)
    group = get_placement_group(args.name)
    actor: Any = ray.remote(Relay)
    relay = actor.options(
        max_concurrency=4, num_cpus=0, num_gpus=args.gpus,
        scheduling_strategy=PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=args.bundle)).remote()
    try:
        node, _ = ray.get(relay.start.remote(argv, os.getcwd()), timeout=args.timeout)
    except ray.exceptions.GetTimeoutError:
        print(f"Ray did not start the command in bundle {args.bundle} within {args.timeout:g} s: "
              "its node may be gone, or busy with another cluster's work (ray status)",
              file=sys.stderr, flush=True)
        return 255
    except ray.exceptions.RayError as e:
        print(f"Ray could not start the command in bundle {args.bundle}: {e}", file=sys.stderr,
              flush=True)
        return 255
    if args.expect and node != args.expect:
        ray.kill(relay)  # (its command, the agent, ends at the end of its input)
        print(f"bundle {args.bundle} is on node {node} now, not on {args.expect}, where the "
              "cluster was placed (Ray moved it after that node left the cluster): define the "
              "cluster again (%cluster)", file=sys.stderr, flush=True)
        return 255

    def pump(which: str, out: IO[bytes]) -> None:
        try:
            for ref in relay.read.remote(which):
                out.write(ray.get(ref))
                out.flush()
        except ray.exceptions.RayError as e:
            print(f"the Ray actor relaying the command died: {e}", file=sys.stderr, flush=True)
        except OSError:  # no one reads this side any more
            pass

    pumps = [threading.Thread(target=pump, args=(w, o), daemon=True)
             for w, o in (("out", sys.stdout.buffer), ("err", sys.stderr.buffer))]
    for t in pumps:
        t.start()

    def feed() -> None:
        try:
            while True:
                data = given.get()
                ray.get(relay.write.remote(data))
                if not data:
                    return
        except ray.exceptions.RayError:
            pass

    threading.Thread(target=feed, daemon=True).start()
    try:
        code = int(ray.get(relay.wait.remote()))
    except ray.exceptions.RayError as e:
        print(f"the Ray actor relaying the command died: {e}", file=sys.stderr, flush=True)
        return 255
    for t in pumps:  # all it said, its last reports too
        t.join()
    return code if code >= 0 else 128 - code


def main() -> int:
    parser = argparse.ArgumentParser(prog="_rayrelay.py")
    parser.add_argument("mode", choices=("hold", "run"))
    parser.add_argument("--address", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--bundles", type=int, default=1)
    parser.add_argument("--bundle", type=int, default=0)
    parser.add_argument("--cpus", type=float, default=1)
    parser.add_argument("--gpus", type=float, default=0)
    parser.add_argument("--strategy", default="SPREAD")
    parser.add_argument("--timeout", type=float, default=60)
    parser.add_argument("--expect", default="", help="the node address the bundle must be on")
    words = sys.argv[1:]
    cut = words.index("--") if "--" in words else len(words)
    args = parser.parse_args(words[:cut])
    if args.mode == "hold":
        return hold(args)
    return run(args, words[cut + 1:])


if __name__ == "__main__":
    sys.exit(main())
