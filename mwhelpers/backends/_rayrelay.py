"""The Ray backend's helper process, run by path on the kernel's machine with the kernel's Python
(which has Ray): ``python _rayrelay.py hold|run [OPTIONS] [-- ARGV...]``.

``hold`` is the cluster's one Ray driver.  It connects to the Ray cluster, makes the cluster's
placement group (one bundle per task, named, spread or packed), listens on a Unix socket
(``--listen``, in a folder only this user reads), prints one JSON line (``{"nodes": [...]}``: each
bundle's node address, or ``{"error": ...}``) and holds the group until its standard input ends
(the kernel closed the cluster, or died).  Ray then removes the group, and with it every actor
placed in it.  Meanwhile it runs the commands that ``run`` clients bring: each on its bundle's
node, through that bundle's one actor (made at the first command there).

``run`` is the transport of one command on one bundle's node, as ``ssh HOST`` is for the ssh
backend.  It imports nothing of Ray: it connects to the holder's socket (``--via``) and relays
its standard input to the command and the command's standard output and error back, until it
ends; its exit code is this process's.  ``{python}`` as ARGV's first word is the Python that runs
Ray on that node.  When this process ends (the kernel closed the connection, killed it, or
died), the holder closes the command's input, as the end of an actor of its own did: the
mwhelpers agent that the command runs then ends its task.  One driver and one
actor a bundle, instead of one each a command, spare Ray's connections (2026-11-30: about 9 CPU-s
a command on a 2-core machine).

Run by path, never imported as part of mwhelpers: Ray sends the actor's class by value from
``__main__``, so the nodes need Ray and Python, not mwhelpers.
"""

import argparse
import json
import logging
import os
import queue
import socket
import struct
import subprocess
import sys
import threading
import uuid
from typing import IO, Any

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
# Threads of a bundle's actor: each command holds three (its output, its errors, its end).
ACTOR_THREADS = 128

# Between a run client and the holder, frames: a kind, a length, and that many bytes.  The
# client sends HEAD (JSON: what to run where), then IN (its input; empty: the input's end); the
# holder sends OUT and ERR (the command's), then EXIT (its exit code, as text).
FRAME = struct.Struct("!cI")
HEAD, IN, OUT, ERR, EXIT = b"h", b"i", b"o", b"e", b"x"

ray: Any = None  # the module, imported by the holder only (the run client does without)


def _import_ray() -> None:
    global ray
    import ray as module  # here: a run client never pays for Ray's import
    import ray.util.placement_group
    import ray.util.scheduling_strategies

    ray = module


class Channel:
    """One end of a run client's connection: frames out (from any thread), frames in."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lock = threading.Lock()
        self.reader = sock.makefile("rb")

    def send(self, kind: bytes, payload: bytes = b"") -> bool:
        try:
            with self.lock:
                self.sock.sendall(FRAME.pack(kind, len(payload)) + payload)
            return True
        except OSError:
            return False

    def receive(self) -> tuple[bytes, bytes] | None:
        """The next frame; None at the end (the other side left)."""
        try:
            head = self.reader.read(FRAME.size)
            if len(head) < FRAME.size:
                return None
            kind, size = FRAME.unpack(head)
            payload = self.reader.read(size) if size else b""
        except OSError:
            return None
        return (kind, payload) if len(payload) == size else None


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
        return _hold(args)
    finally:  # its socket and the folder the kernel made for it (empty then), however it ends
        for remove in (os.unlink, os.rmdir):
            try:
                remove(args.listen if remove is os.unlink else os.path.dirname(args.listen))
            except OSError:
                pass


def _hold(args: argparse.Namespace) -> int:
    try:
        _import_ray()
        from ray.util.placement_group import placement_group, remove_placement_group

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
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(args.listen)
        server.listen(64)
        print(json.dumps({"nodes": nodes, "token_sent": token_sent()}), flush=True)
    except Exception as e:  # said in the kernel, which reads this line
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
        return 1
    bundles = Bundles(group, args.gpus)
    threading.Thread(target=serve, args=(server, bundles), daemon=True).start()
    while sys.stdin.buffer.read(65536):  # until the kernel closes it, or dies
        pass
    server.close()
    remove_placement_group(group)
    return 0


class Relay:
    """The commands on one bundle's node: started, fed, read, waited for and stopped, each by
    its key (an actor with threads enough for all of them at once)."""

    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, key: str, argv: list[str], cwd: str) -> tuple[str, int]:
        if argv[:1] == ["{python}"]:  # (mwhelpers.taskside.wire.THIS_PYTHON)
            argv = [sys.executable, *argv[1:]]
        env = {k: v for k, v in os.environ.items()
               if k not in NOT_PASSED and not k.startswith("RAY_")}
        proc = subprocess.Popen([sys.executable, "-c", WAITER, *argv],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env,
                                cwd=cwd if cwd and os.path.isdir(cwd) else None)
        self.procs[key] = proc
        return str(ray.util.get_node_ip_address()), proc.pid

    def write(self, key: str, data: bytes) -> None:
        proc = self.procs.get(key)
        if proc is not None:
            self._give(proc, data)

    @staticmethod
    def _give(proc: "subprocess.Popen[bytes]", data: bytes) -> None:
        """``data`` to ``proc``'s input; nothing: the input's end."""
        stdin = proc.stdin
        assert stdin is not None
        try:
            if data:
                stdin.write(data)
                stdin.flush()
            else:
                stdin.close()
        except (OSError, ValueError):
            pass

    def read(self, key: str, which: str) -> Any:  # a generator: Ray streams what it yields
        proc = self.procs[key]
        pipe = proc.stdout if which == "out" else proc.stderr
        assert pipe is not None
        fd = pipe.fileno()
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                return
            yield chunk

    def wait(self, key: str) -> int:
        return self.procs[key].wait()

    def forget(self, key: str) -> None:
        """Its output is all read: the command is done with (its reads may start after its
        end, so only then)."""
        self.procs.pop(key, None)

    def stop(self, key: str) -> None:
        """Its client left: the command's input ends, as when Ray ended an actor of its own;
        the mwhelpers agent it runs then ends its task, and itself."""
        proc = self.procs.get(key)
        if proc is not None:
            self._give(proc, b"")


class Bundles:
    """Each bundle's actor, made at its first command; made again if it died."""

    def __init__(self, group: Any, gpus: float) -> None:
        self.group, self.gpus = group, gpus
        self.actors: dict[int, Any] = {}
        self.lock = threading.Lock()

    def actor(self, index: int, dead: Any = None) -> Any:
        """Bundle ``index``'s actor; a new one where it has none, or where it is ``dead`` (that
        handle, so that two commands that saw it die make one new actor, not two)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        with self.lock:
            if index not in self.actors or (dead is not None and self.actors[index] is dead):
                self.actors[index] = ray.remote(Relay).options(
                    max_concurrency=ACTOR_THREADS, num_cpus=0, num_gpus=self.gpus,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        self.group, placement_group_bundle_index=index)).remote()
            return self.actors[index]


def serve(server: socket.socket, bundles: Bundles) -> None:
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            if server.fileno() == -1:  # closed: the cluster is going
                return
            continue
        threading.Thread(target=relay_one, args=(Channel(conn), bundles), daemon=True).start()


def relay_one(chan: Channel, bundles: Bundles) -> None:
    """One run client's command, from its HEAD frame to its EXIT frame; whatever goes wrong
    here, the client hears an exit code and the connection is closed."""
    try:
        first = chan.receive()
        if first is not None and first[0] == HEAD:
            _relay_command(chan, bundles, json.loads(first[1]))
    except Exception as e:  # (a bug here: the client must not wait for ever)
        chan.send(ERR, f"the Ray relay failed: {type(e).__name__}: {e}\n".encode())
        chan.send(EXIT, b"255")
    finally:
        chan.reader.close()
        try:
            chan.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        chan.sock.close()


def _relay_command(chan: Channel, bundles: Bundles, head: dict[str, Any]) -> None:
    index, timeout, expect = int(head["bundle"]), float(head["timeout"]), head["expect"]
    given: queue.Queue[bytes | None] = queue.Queue()  # None: the client left
    vanished = threading.Event()  # it left before its input ended: none of it is delivered

    def take() -> None:  # the client's input, kept until the command runs
        while (frame := chan.receive()) is not None:
            if frame[0] == IN:
                given.put(frame[1])
                if not frame[1]:
                    break
        else:
            vanished.set()
        while chan.receive() is not None:  # then, only whether it leaves
            pass
        given.put(None)

    threading.Thread(target=take, daemon=True).start()
    key = uuid.uuid4().hex
    try:
        actor, node = _start(bundles, index, key, head, timeout)
    except (TimeoutError, RuntimeError) as e:
        chan.send(ERR, f"{e}\n".encode())
        chan.send(EXIT, b"255")
        return
    if expect and node != expect:
        threading.Thread(target=_drop, args=(actor, key), daemon=True).start()
        chan.send(ERR, (f"bundle {index} is on node {node} now, not on {expect}, where the "
                        "cluster was placed (Ray moved it after that node left the cluster): "
                        "define the cluster again (%cluster)\n").encode())
        chan.send(EXIT, b"255")
        return
    _relay_running(chan, actor, key, given, vanished)


def _drop(actor: Any, key: str, started: Any = None) -> None:
    """End a command nobody relays (once it has started, where ``started`` says when): its
    input ends, the agent in it leaves, and it is waited for and forgotten."""
    try:
        if started is not None:
            ray.get(started)
        ray.get(actor.stop.remote(key))
        ray.get(actor.wait.remote(key))
        actor.forget.remote(key)
    except ray.exceptions.RayError:
        pass


def _start(bundles: Bundles, index: int, key: str, head: dict[str, Any],
           timeout: float) -> tuple[Any, str]:
    """Start the command on bundle ``index``'s actor (made again once, if it died): the actor
    and its node.  TimeoutError or RuntimeError: what to tell the client."""
    dead = None
    for _ in range(2):
        actor = bundles.actor(index, dead)
        started = actor.start.remote(key, head["argv"], head["cwd"])
        try:
            node, _ = ray.get(started, timeout=timeout)
            return actor, node
        except ray.exceptions.GetTimeoutError:
            # It may start later: then it is ended, as the old driver's exit ended its actor.
            threading.Thread(target=_drop, args=(actor, key, started), daemon=True).start()
            raise TimeoutError(
                f"Ray did not start the command in bundle {index} within {timeout:g} s: its node "
                "may be gone, or busy with another cluster's work (ray status)") from None
        except ray.exceptions.ActorDiedError as e:
            if dead is not None:
                raise RuntimeError(f"Ray could not start the command in bundle {index}: {e}") from e
            dead = actor
        except ray.exceptions.RayError as e:
            raise RuntimeError(f"Ray could not start the command in bundle {index}: {e}") from e
    raise AssertionError("unreachable")


def _relay_running(chan: Channel, actor: Any, key: str, given: "queue.Queue[bytes | None]",
                   vanished: threading.Event) -> None:
    def pump(which: str, kind: bytes) -> None:
        try:
            for ref in actor.read.remote(key, which):
                chan.send(kind, ray.get(ref))
        except ray.exceptions.RayError as e:
            chan.send(ERR, f"the Ray actor relaying the command died: {e}\n".encode())

    pumps = [threading.Thread(target=pump, args=(w, k), daemon=True)
             for w, k in (("out", OUT), ("err", ERR))]
    for t in pumps:
        t.start()

    def feed() -> None:
        try:
            data = given.get()
            while data is not None and not vanished.is_set():
                ray.get(actor.write.remote(key, data))
                if not data:
                    break
                data = given.get()
            while data is not None:  # (its input has ended) until the client leaves
                data = given.get()
            actor.stop.remote(key)
        except ray.exceptions.RayError:
            pass

    threading.Thread(target=feed, daemon=True).start()
    try:
        code = int(ray.get(actor.wait.remote(key)))
    except ray.exceptions.RayError as e:
        chan.send(ERR, f"the Ray actor relaying the command died: {e}\n".encode())
        code = 255
    for t in pumps:  # all it said, its last reports too
        t.join()
    actor.forget.remote(key)
    chan.send(EXIT, str(code if code >= 0 else 128 - code).encode())


def run(args: argparse.Namespace, argv: list[str]) -> int:
    """The transport's client: no Ray here, only the holder's socket."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(args.via)
    except OSError as e:
        print(f"this cluster's Ray driver is gone ({e}): define the cluster again (%cluster)",
              file=sys.stderr, flush=True)
        return 255
    chan = Channel(sock)
    chan.send(HEAD, json.dumps({"bundle": args.bundle, "expect": args.expect,
                                "timeout": args.timeout, "argv": argv,
                                "cwd": os.getcwd()}).encode())

    def feed() -> None:  # the input, read at once: the holder keeps it until the command runs
        try:
            while True:
                data = os.read(0, 65536)
                if not chan.send(IN, data) or not data:
                    return
        except OSError:
            chan.send(IN, b"")

    threading.Thread(target=feed, daemon=True).start()
    outs: dict[bytes, IO[bytes]] = {OUT: sys.stdout.buffer, ERR: sys.stderr.buffer}
    while (frame := chan.receive()) is not None:
        kind, payload = frame
        if kind == EXIT:
            return int(payload)
        if kind in outs:
            try:
                outs[kind].write(payload)
                outs[kind].flush()
            except OSError:  # no one reads this side any more
                pass
    print("this cluster's Ray driver ended while the command ran", file=sys.stderr, flush=True)
    return 255


def main() -> int:
    parser = argparse.ArgumentParser(prog="_rayrelay.py")
    parser.add_argument("mode", choices=("hold", "run"))
    parser.add_argument("--address", help="the Ray cluster's (hold)")
    parser.add_argument("--namespace", help="the placement group's Ray namespace (hold)")
    parser.add_argument("--name", help="the placement group's name (hold)")
    parser.add_argument("--listen", help="the socket the holder takes commands on (hold)")
    parser.add_argument("--via", help="the holder's socket (run)")
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
        if not (args.address and args.namespace and args.name and args.listen):
            parser.error("hold needs --address, --namespace, --name and --listen")
        return hold(args)
    if not args.via:
        parser.error("run needs --via")
    return run(args, words[cut + 1:])


if __name__ == "__main__":
    sys.exit(main())
