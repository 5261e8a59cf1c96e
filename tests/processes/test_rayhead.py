"""A private Ray head (``%cluster ... --backend ray --address local``) whose ``ray start`` fails
says so at once, with the end of its log, and leaves no folder; a start whose raylet missed the
30 s that Ray gives it to register ("timed out during startup", seen on a loaded 2-core
machine) is tried once more.

``PrivateHead`` runs the ``ray`` beside its Python, so the program runs from a copy of the
environment's layout whose ``ray`` fails the way Ray does (the real head is started in
hosts/test_ray.py)."""

import os
import shutil
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT

TIMED_OUT = ("Exception: The current node timed out during startup. This could happen because "
             "some of the raylet failed to startup or the GCS has become overloaded.")


def start_head(tmp_path, says):
    if not (Path(sys.prefix) / "pyvenv.cfg").exists():
        pytest.skip("needs a virtual environment (its pyvenv.cfg) to copy the layout of")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    shutil.copy(Path(sys.prefix) / "pyvenv.cfg", venv / "pyvenv.cfg")
    (venv / "bin" / "python").symlink_to(os.path.realpath(sys.executable))
    ray = venv / "bin" / "ray"
    ray.write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path / 'calls'}\necho '{says}'\nexit 1\n")
    ray.chmod(0o755)
    program = textwrap.dedent(f"""
        import sys
        sys.path[1:1] = {[str(ROOT), *site.getsitepackages()]!r}
        from mwhelpers.backends.raynodes import PrivateHead
        try:
            PrivateHead()
        except Exception as e:
            print(type(e).__name__, e)
        """)
    heads = tmp_path / "heads"
    heads.mkdir()
    out = subprocess.run([str(venv / "bin" / "python"), "-c", program], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "TMPDIR": str(heads)})
    calls = (tmp_path / "calls").read_text().splitlines()
    return out.stdout.strip(), calls, list(heads.iterdir())


def test_a_head_that_missed_rays_startup_window_is_started_once_more(tmp_path):
    said, calls, left = start_head(tmp_path, TIMED_OUT)
    assert len(calls) == 2 and all(c.startswith("start --head --node-ip-address=127.0.0.1")
                                   for c in calls), calls
    assert said == ("InfrastructureError a private Ray head could not be started here: "
                    f"`ray start` ended; its log's last lines: {TIMED_OUT}"), said
    assert left == []  # each attempt's folder (token, log) removed


def test_a_head_whose_ray_start_fails_otherwise_is_not_started_again(tmp_path):
    said, calls, left = start_head(tmp_path, "ray: error: no such option")
    assert len(calls) == 1
    assert said.endswith("`ray start` ended; its log's last lines: ray: error: no such option")
    assert left == []
