"""The kernel's first ``import tensorflow`` after ``%load_ext mwhelpers``: TensorFlow's start-up
records written to descriptor 2 stay out of the cell, its other lines do not.

A stand-in ``tensorflow`` package that writes such lines with ``os.write(2, ...)`` as TensorFlow's
shared libraries do, in a fresh interpreter; the real one in a real kernel is checked by the
notebooks' runs (tests/kernels/test_notebooks.py: no red block under 03's import cell).
"""

import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT

from mwhelpers import quietimport

NOISE = ("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
         "I0000 00:00:1795567025.180426    8044 port.cc:153] oneDNN custom operations are on.\n")
NEWS = "W0000 00:00:1795567025.180426    8044 something.cc:1] a real warning\n"
FAKE = textwrap.dedent(f"""
    import os
    os.write(2, {(NOISE + NEWS).encode()!r})
    VALUE = 42
""")


def run(tmp_path, verbose):
    (tmp_path / "tensorflow").mkdir(exist_ok=True)
    (tmp_path / "tensorflow" / "__init__.py").write_text(FAKE)
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r}); sys.path.insert(0, {str(ROOT)!r})
        from mwhelpers import quietimport
        assert quietimport.install(lambda: {verbose})
        import tensorflow
        print("value", tensorflow.VALUE, type(tensorflow.__loader__).__name__,
              type(tensorflow.__spec__.loader).__name__, len(quietimport.hidden))
        assert not quietimport.install(lambda: False)   # once, the first import only
        print("finders left", sum(type(f).__name__ == "_Finder" for f in sys.meta_path))
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("verbose", [False, True])
def test_the_start_up_records_stay_out_and_the_rest_shows(tmp_path, verbose):
    done = run(tmp_path, verbose)
    assert done.returncode == 0, done.stderr
    assert done.stderr == (NOISE + NEWS if verbose else NEWS)
    hidden = 0 if verbose else 2
    assert f"value 42 SourceFileLoader SourceFileLoader {hidden}" in done.stdout  # its own loader
    assert "finders left 0" in done.stdout


def test_nothing_is_armed_once_tensorflow_is_imported(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", object())
    assert not quietimport.install(lambda: False)
