"""Run each mend's reproducer on one Keras, unmended and mended: one row of the sweep table in
docs/keras-versions.md.

    python sweep.py [--python PY] [--keras DIR] [--cases 20585,resume,...] [--timeout S]

``--python`` is the interpreter of the environment (its TensorFlow); ``--keras DIR`` puts
``DIR/keras`` first on the path of the reproducer and its workers (an unpacked Keras wheel, or
a copy with the upstream patches applied).  Each case runs twice: as is (``MWHELPERS_KERAS_FIX=0``
where the reproducer would arm anything) and with mwhelpers' mends (``--with-mwhelpers``, or
``--mend``), this checkout first on the path.  Prints one line per case:

    CASE Keras X: unmended VERDICT; mended VERDICT; mend: the [mwhelpers] line of that mend

A verdict is what the reproducer printed (FIXED / BUG PRESENT) or, for the MirroredStrategy
case, the steps applied and whether the weights stayed finite.  Cases:

- ``20585``: fit and evaluate on two MWMS workers (docs/keras-20585.md);
- ``resume``: BackupAndRestore(save_freq=3) stopped inside an epoch (docs/keras-backup-resume.md);
- ``lossscale``: one MWMS worker overflowing under mixed_float16 (docs/keras-lossscale.md);
- ``mirrored``: one replica overflowing under MirroredStrategy in one process (the same);
- ``pss``: optimizer.iterations under ParameterServerStrategy (docs/keras-pss-iterations.md);
- ``tensorboard``: who writes to log_dir on two MWMS workers (docs/keras-tensorboard.md).
"""

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# case: (reproducer and its arguments, the flag that arms the mends, the mend's issue tag)
CASES = {
    "20585": ([DOCS / "keras-20585" / "repro.py"], "--with-mwhelpers", "keras-team/keras#20585"),
    "resume": ([DOCS / "keras-backup-resume" / "repro.py"], "--with-mwhelpers",
               "BackupAndRestore"),
    "lossscale": ([DOCS / "keras-lossscale" / "repro.py"], "--with-mwhelpers",
                  "keras-lossscale.md"),
    "mirrored": ([ROOT / "tests" / "programs" / "keras3_mixed_mirrored.py"], "--mend",
                 "keras-lossscale.md"),
    "pss": ([DOCS / "keras-pss-iterations" / "repro.py", "150"], "--with-mwhelpers",
            "keras-pss-iterations.md"),
    "tensorboard": ([DOCS / "keras-tensorboard" / "repro.py"], "--with-mwhelpers",
                    "keras-tensorboard.md"),
}


def verdict(case, code, out):
    if case == "mirrored":
        line = next((ln for ln in out.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            return f"exit {code}: {out.strip().splitlines()[-1] if out.strip() else ''}"[:160]
        r = json.loads(line[len("RESULT "):])
        return (f"{r['iterations']} of 12 steps, scale {r['loss_scale']:g}, "
                f"{'finite' if r['finite'] else 'NaN'} weights")
    found = re.findall(r"^(FIXED|BUG PRESENT|BUG)\b", out, re.M)
    if found:
        return found[-1] if found[-1] != "BUG" else "BUG PRESENT"
    tail = out.strip().splitlines()[-1] if out.strip() else ""
    return f"exit {code}: {tail}"[:160]


def run(python, keras_dir, case, mended, timeout):
    script, flag, tag = CASES[case]
    path = [str(keras_dir)] if keras_dir else []
    if mended:
        path.append(str(ROOT))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "TF_CPP_MIN_LOG_LEVEL": "2",
           "MWHELPERS_KERAS_FIX": "1" if mended else "0"}
    env.pop("TF_CONFIG", None)
    command = [python, *map(str, script), *([flag] if mended else [])]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env=env, cwd=ROOT)
        code, out = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as e:
        code, out = "timeout", (e.stdout or b"").decode(errors="replace") if isinstance(
            e.stdout, bytes) else (e.stdout or "")
    version = re.search(r"Keras (\d+\.\d+[\w.]*)", out)
    lines = [ln.strip() for ln in out.splitlines()
             if "[mwhelpers]" in ln and tag in ln]
    return verdict(case, code, out), version.group(1) if version else "?", lines


def has_tensorboard(python):
    """Whether ``python`` can import the tensorboard package (Keras's TensorBoard callback
    needs it; tensorflow-cpu 2.21 no longer installs it)."""
    return subprocess.run([python, "-c", "import tensorboard"], capture_output=True,
                          timeout=120).returncode == 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--keras", default=None)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    for case in args.cases.split(","):
        if case == "tensorboard" and not has_tensorboard(args.python):
            print(f"{case}: not run: the tensorboard package is not installed", flush=True)
            continue
        plain, version, _ = run(args.python, args.keras, case, False, args.timeout)
        mended, version2, lines = run(args.python, args.keras, case, True, args.timeout)
        mend = re.sub(r"\s+", " ", lines[0])[:220] if lines else "(no line)"
        print(f"{case} Keras {version if version != '?' else version2}: unmended {plain}; "
              f"mended {mended}; mend: {mend}", flush=True)


if __name__ == "__main__":
    main()
