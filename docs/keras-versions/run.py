"""Run prog.py as docs/keras-versions.md's table does, with the Keras of a given Python.

    python run.py [--python PY] [--runs reference,unfixed,fixed,spe] [--timeout S]

Each run starts prog.py through mwhelpers' worker start-up (`mwhelpers/taskside/_bootstrap.py`
of this checkout, which needs nothing installed) on 127.0.0.1 with a TF_CONFIG per task:

- `reference`: one worker alone, the numbers every other run is compared with;
- `unfixed`: two workers with `MWHELPERS_KERAS_FIX=0` (Keras as released);
- `fixed`: two workers with the mends on (the default);
- `spe`: two workers, the mends on, compiled with `steps_per_execution=2`;
- `mirrored_spe`: one process, MirroredStrategy over two logical CPUs (two replicas, no
  TF_CONFIG), compiled with `steps_per_execution=2`.

Prints one line per run: the exit codes, then the first known error, or the logged losses,
`evaluate`, the number of predictions and the weights (sum and hash), and whether the weights
equal the reference's. The logs stay in a new temporary folder (or ``--logs DIR``), named at
the end.
"""

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
BOOTSTRAP = HERE.parents[1] / "mwhelpers" / "taskside" / "_bootstrap.py"
ERRORS = ("Attempt to convert a value (PerReplica", "Invalid reduction dimension 0",
          "You must feed a value for placeholder tensor")
RUNS = {"reference": (1, "fit", "1"), "unfixed": (2, "fit", "0"),
        "fixed": (2, "fit", "1"), "spe": (2, "spe", "1"), "mirrored_spe": (0, "mirrored-spe", "1")}


def reserve_port():
    """A loopback port bound with SO_REUSEADDR and not listening: no other
    program takes it while the socket is open, and TensorFlow's gRPC server
    (SO_REUSEADDR too) can still bind it. Close it when the workers exit."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    return s


def run(python, name, folder, timeout):
    workers, mode, fix = RUNS[name]
    held = [reserve_port() for _ in range(workers)]
    hosts = [f"127.0.0.1:{s.getsockname()[1]}" for s in held]
    procs, logs = [], []
    for i in range(max(workers, 1)):
        # TMPDIR: a killed worker's autograph modules stay with the logs, not in /tmp
        env = dict(os.environ, MWHELPERS_KERAS_FIX=fix, CUDA_VISIBLE_DEVICES="",
                   TF_CPP_MIN_LOG_LEVEL="2", TMPDIR=str(folder))
        env.pop("TF_CONFIG", None)
        if workers:
            env["TF_CONFIG"] = json.dumps(
                {"cluster": {"worker": hosts}, "task": {"type": "worker", "index": i}})
        log = folder / f"{name}-{i}.log"
        logs.append(log)
        with open(log, "w") as out:
            procs.append(subprocess.Popen(
                [python, "-u", str(BOOTSTRAP), str(HERE / "prog.py"), mode,
                 str(folder / f"{name}-{i}")], env=env, stdout=out,
                stderr=subprocess.STDOUT))
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            codes.append("timeout")
    for s in held:
        s.close()
    return codes, [log.read_text(errors="replace") for log in logs]


def summary(codes, texts):
    first = texts[0]
    error = next((e for e in ERRORS if any(e in t for t in texts)), None)
    fields = {"exit": "/".join(map(str, codes))}
    if error:
        fields["error"] = error
    for key in ("REPLICAS", "HISTORY", "EVALUATE", "PREDICT", "WEIGHTS"):
        m = re.search(rf"^{key} (.*)$", first, re.M)
        if m:
            fields[key.lower()] = m.group(1)
    sums = {m for t in texts for m in re.findall(r"^WEIGHTS (.*)$", t, re.M)}
    fields["equal_weights"] = len(sums) == 1 and len(texts) > 1
    version = re.search(r"Keras (\d+\.\d+[\w.]*)", "\n".join(texts))
    return fields, version.group(1) if version else "?"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--runs", default=",".join(RUNS))
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--logs", type=Path, help="a folder for the logs (made if missing)")
    args = parser.parse_args()
    folder = args.logs or Path(tempfile.mkdtemp(prefix="keras-versions-"))
    folder.mkdir(parents=True, exist_ok=True)
    reference = None
    for name in args.runs.split(","):
        codes, texts = run(args.python, name, folder, args.timeout)
        fields, version = summary(codes, texts)
        if name == "reference":
            reference = fields.get("weights")
        elif reference and "weights" in fields:
            fields["as_reference"] = fields["weights"] == reference
        print(f"{name} (Keras {version}): {json.dumps(fields)}", flush=True)
    print(f"logs: {folder}")


if __name__ == "__main__":
    main()
