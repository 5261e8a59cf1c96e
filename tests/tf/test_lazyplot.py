"""lazyplot: a worker's Keras import leaves matplotlib out until a plot needs it (real TF, Keras)."""

import json

from mwhelpers.taskside.lazyplot import NOTICE

PROGRAM = """
import json, sys, types
import keras
from keras.src.visualization import plot_bounding_box_gallery as boxes, plot_image_gallery as gallery
after_keras = sorted(m for m in ("matplotlib", "matplotlib.pyplot", "matplotlib.patches") if m in sys.modules)
figure = gallery.plt.figure          # the gallery's first use of pyplot imports the real one
patch = boxes.patches.Patch          # and the box gallery's of patches
import matplotlib.pyplot as plt      # and the program's own import gets that same real one
import matplotlib.patches
print("RESULT " + json.dumps({
    "after_keras": after_keras,
    "real": (figure is plt.figure and patch is matplotlib.patches.Patch
             and type(plt) is type(matplotlib.patches) is types.ModuleType and bool(plt.__file__)),
    "backend": plt.get_backend().lower(),
}), flush=True)
"""


def result(rt, **kw):
    run = rt.launch("worker:0", code=PROGRAM, timeout=120, env={"MPLBACKEND": "agg", **kw})
    line = [ln for ln in run.lines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):]), run.lines()


def test_keras_in_a_worker_imports_pyplot_only_when_a_plot_needs_it(rt):
    rt.define_cluster(workers=1)
    out, lines = result(rt)
    assert out == {"after_keras": [], "real": True, "backend": "agg"}
    assert lines.count(NOTICE) == 1                   # the log says so once...
    assert not any(line.startswith("[worker:0] [mwhelpers] matplotlib") for line in rt.echo_lines)
    rt.define_cluster(workers=1)
    out, lines = result(rt, MWHELPERS_LAZY_PYPLOT="0")  # turned off: Keras's own import
    assert out == {"after_keras": ["matplotlib", "matplotlib.patches", "matplotlib.pyplot"],
                   "real": True, "backend": "agg"}
    assert NOTICE not in lines
