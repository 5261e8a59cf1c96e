"""The stall workaround never breaks a worker: when TensorFlow's private names it wraps
are missing or changed, the worker runs unpatched and its log says so in one line.

A TensorFlow that renamed them is simulated by a stand-in ``tensorflow`` package on the
worker's PYTHONPATH, laid out like the real one where the workaround looks.
"""

import textwrap

import pytest

SKIPPED = "[mwhelpers] the end-of-fit stall workaround is not applied"
NOTICE = "[mwhelpers] tf.data autotuning is off"

STRATEGY = {
    # what a future TensorFlow might do to collective_all_reduce_strategy.py
    "as today": """
        class CollectiveAllReduceExtended:
            def _experimental_distribute_dataset(self, dataset, options):
                return ("distributed", dataset, options)
            def _distribute_datasets_from_function(self, dataset_fn, options):
                return ("from function", dataset_fn(None), options)
    """,
    "method renamed": """
        class CollectiveAllReduceExtended:
            def _distribute_dataset(self, dataset, options):
                return ("distributed", dataset, options)
            def _distribute_datasets_from_function(self, dataset_fn, options):
                return ("from function", dataset_fn(None), options)
    """,
    "arguments changed": """
        class CollectiveAllReduceExtended:
            def _experimental_distribute_dataset(self, options, dataset):
                return ("distributed", dataset, options)
            def _distribute_datasets_from_function(self, dataset_fn, options):
                return ("from function", dataset_fn(None), options)
    """,
    "class gone": """
        class CollectiveAllReduceStrategyExtended:
            pass
    """,
    "class raises on access": """
        class _Meta(type):
            def __getattribute__(cls, name):
                if name.startswith("_experimental"):
                    raise RuntimeError("lazily loaded, not yet")
                return super().__getattribute__(name)
        class CollectiveAllReduceExtended(metaclass=_Meta):
            pass
    """,
}

DEVICE_OPS = {
    "as today": "def _create_device_dataset(ds, *a, **k):\n    return ds\n",
    "per-device dataset gone": "def _build_device_dataset(ds, *a, **k):\n    return ds\n",
}

# A worker program: import TensorFlow (the hook fires), then distribute a dataset through the
# private method the way fit does, when the stand-in still has it.
PROGRAM = textwrap.dedent("""
    import tensorflow as tf
    from tensorflow.python.distribute import collective_all_reduce_strategy as c

    class Dataset:
        def __init__(self, options=None):
            self.options = options
        def with_options(self, options):
            return Dataset(options)

    ext = getattr(c, "CollectiveAllReduceExtended", None)
    try:
        method = getattr(ext, "_experimental_distribute_dataset", None)
    except RuntimeError:
        method = None
    if callable(method):
        kind, *got = method(ext(), Dataset(), "opts")
        ds = next(x for x in got if isinstance(x, Dataset))
        print("DISTRIBUTED", kind, "autotune", "off" if ds.options is not None else "untouched")
    print("DONE")
""")


def fake_tensorflow(root, strategy, device_ops):
    files = {
        "tensorflow/__init__.py": "__version__ = '9.9.0'\n"
                                  "from tensorflow.python.distribute import collective_all_reduce_strategy\n",
        "tensorflow/python/__init__.py": "",
        "tensorflow/python/distribute/__init__.py": "",
        "tensorflow/python/distribute/collective_all_reduce_strategy.py": textwrap.dedent(strategy),
        "tensorflow/python/data/__init__.py": "",
        "tensorflow/python/data/ops/__init__.py": "",
        "tensorflow/python/data/ops/multi_device_iterator_ops.py": device_ops,
        # tf.data.Options(), as the workaround builds it
        "tensorflow/data.py": "class _A:\n    enabled = None\n\n"
                              "class Options:\n    def __init__(self):\n        self.autotune = _A()\n",
    }
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (root / "tensorflow" / "__init__.py").write_text(
        files["tensorflow/__init__.py"] + "from tensorflow import data\n")
    return root


def run_with(rt, tmp_path, monkeypatch, strategy, device_ops="as today"):
    fake = fake_tensorflow(tmp_path / "fake_tf", STRATEGY[strategy], DEVICE_OPS[device_ops])
    monkeypatch.setenv("PYTHONPATH", str(fake))
    rt.define_cluster(workers=1)
    run = rt.launch("worker:0", code=PROGRAM, timeout=60)
    assert run.returncode == 0, "\n".join(run.lines())
    return run.lines()


@pytest.mark.parametrize("change", ["method renamed", "arguments changed", "class gone",
                                    "class raises on access"])
def test_a_changed_tensorflow_runs_unpatched_and_the_log_says_why_once(rt, tmp_path, monkeypatch,
                                                                     change):
    lines = run_with(rt, tmp_path, monkeypatch, change)
    said = [ln for ln in lines if ln.startswith(SKIPPED)]
    assert len(said) == 1, lines
    assert "TensorFlow 9.9.0" in said[0] or "RuntimeError: lazily loaded" in said[0], said
    assert not any(ln.startswith(NOTICE) for ln in lines)
    assert "DONE" in lines
    if change == "arguments changed":  # the original method still runs, dataset untouched
        assert "DISTRIBUTED distributed autotune untouched" in lines


def test_without_the_per_device_dataset_nothing_is_switched_off(rt, tmp_path, monkeypatch):
    lines = run_with(rt, tmp_path, monkeypatch, "as today", "per-device dataset gone")
    said = [ln for ln in lines if ln.startswith(SKIPPED)]
    assert len(said) == 1 and "_create_device_dataset" in said[0], lines
    # the user's dataset alone would not end the stall, so it keeps its autotuning
    assert "DISTRIBUTED distributed autotune untouched" in lines
    assert not any(ln.startswith(NOTICE) for ln in lines)


def test_the_stand_in_as_today_is_patched(rt, tmp_path, monkeypatch):
    """The check above is not vacuous: the same stand-in with today's names gets the fix."""
    lines = run_with(rt, tmp_path, monkeypatch, "as today")
    assert "DISTRIBUTED distributed autotune off" in lines
    assert sum(ln.startswith(NOTICE) for ln in lines) == 1
    assert not any(ln.startswith(SKIPPED) for ln in lines)
