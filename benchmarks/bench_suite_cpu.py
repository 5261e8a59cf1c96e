#!/usr/bin/env python
"""Where the notebook suite's CPU goes: each notebook alone, everything it starts counted.

    sudo .venv/bin/python benchmarks/bench_suite_cpu.py [--json FILE] [NOTEBOOK ...]

``bench_suite.py`` counts the CPU of the processes the suite waits for.  Some of what a notebook
starts is not among them: warm-start servers, Ray's daemons, Slurm steps, tasks on the test
hosts.  Here each notebook runs alone (``python -m mwhelpers.workshop.suite NOTEBOOK``) in a
cpuacct cgroup of its own (cgroup v1, root), so its total holds every process it started, on
whatever host namespace.  Every process in the cgroup is also sampled ten times a second, and
its own CPU is put under a kind: the suite's runner, the kernel, warm servers, tasks, Ray, the
notebook's own plain processes (``%%bash`` workers, ``subprocess``).  What no sample saw (a
process shorter than 0.1 s) is given as "unseen".

The runner's share is larger here than in a whole-suite run, which imports papermill once for
all the notebooks.  The figures are for the team's budget work, not a goal of their own.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPUACCT = Path("/sys/fs/cgroup/cpuacct")
TICK = os.sysconf("SC_CLK_TCK")


def kind_of(cmdline: str, comm: str) -> str:
    """What a process of a notebook's run is, from its command line."""
    if "ipykernel" in cmdline:
        return "kernel"
    if "--zygote" in cmdline:
        return "warm server"
    if "_bootstrap.py" in cmdline or "_agent" in cmdline or "_podstart" in cmdline:
        return "task"
    if "ray" in cmdline.lower() or comm in ("raylet", "gcs_server"):
        return "ray"
    if "workshop.suite" in cmdline:
        return "runner"
    if "slurm" in cmdline or comm.startswith("slurm"):
        return "slurm"
    if "ssh" in comm:
        return "ssh"
    return "plain process"


def sample(group: Path, seen: dict) -> None:
    """Each process of ``group`` now: its own CPU seconds, command line and name."""
    for pid in (group / "cgroup.procs").read_text().split():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace")
        except OSError:
            continue
        head, fields = stat.rsplit(")", 1)
        f = fields.split()
        key = (pid, f[19])  # the pid and its start time: a reused pid is another process
        cpu = (int(f[11]) + int(f[12])) / TICK
        old = seen.get(key, (0.0, "", ""))
        seen[key] = (max(cpu, old[0]), cmdline or old[1], head.split("(", 1)[1])


def measure(notebook: Path) -> dict:
    """Run ``notebook`` alone in a cgroup of its own; its wall and CPU seconds, by kind."""
    group = CPUACCT / f"mwhelpers-bench-{os.getpid()}"
    group.mkdir()
    seen: dict = {}
    try:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "mwhelpers.workshop.suite", str(notebook)], cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())))
        while proc.poll() is None:
            sample(group, seen)
            time.sleep(0.1)
        wall = time.monotonic() - t0
        total = int((group / "cpuacct.usage").read_text()) / 1e9
        left = (group / "cgroup.procs").read_text().split()
    finally:
        for pid in (group / "cgroup.procs").read_text().split():  # only what this run left
            try:
                os.kill(int(pid), 9)
            except ProcessLookupError:
                pass
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:  # its last processes are still ending
                time.sleep(0.1)
    kinds: Counter = Counter()
    for cpu, cmdline, comm in seen.values():
        kinds[kind_of(cmdline, comm)] += cpu
    kinds["unseen"] = max(0.0, total - sum(kinds.values()))
    return {"notebook": notebook.name, "ok": proc.returncode == 0, "wall": wall, "cpu": total,
            "left running": len(left), "by kind": dict(kinds)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("notebooks", nargs="*", type=Path)
    p.add_argument("--json", type=Path, help="write the rows here too")
    a = p.parse_args()
    if not (CPUACCT / "cgroup.procs").exists() or not os.access(CPUACCT, os.W_OK):
        print(f"needs a writable cgroup v1 cpuacct hierarchy at {CPUACCT} (root)", file=sys.stderr)
        return 2
    notebooks = a.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))
    rows, total = [], Counter()
    for nb in notebooks:
        row = measure(nb)
        rows.append(row)
        total.update(row["by kind"])
        parts = ", ".join(f"{k} {v:.1f}" for k, v in Counter(row["by kind"]).most_common()
                          if v >= 0.3)
        print(f"{row['notebook']:34} {'ok' if row['ok'] else 'FAILED':6} {row['wall']:6.1f} s "
              f"{row['cpu']:6.1f} CPU-s: {parts}", flush=True)
    print(f"all: {sum(r['wall'] for r in rows):.1f} s, {sum(r['cpu'] for r in rows):.1f} CPU-s: "
          + ", ".join(f"{k} {v:.1f}" for k, v in total.most_common()))
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
