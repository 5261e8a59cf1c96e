"""Make a multi-worker ``fit`` end when its training ends.

Measured on TF 2.21 (see notebooks/03 and benchmarks/bench_suite.py): at the
end of ``model.fit`` under MultiWorkerMirroredStrategy, a worker often sits
8 to 29 s in the destructor of a tf.data iterator before ``fit`` returns.
Native stacks of the stuck worker show why: ``~RootDataset::Iterator`` waits
for its thread pool, in which tf.data's autotuning thread
(``Model::OptimizeLoop``) is sleeping out its optimization period. That period
doubles during training, up to 60 s, so the longer the run, the longer the
possible stall. Two iterators end at that point and both autotune: the one
over your dataset, and the per-device iterator that the strategy's
``MultiDeviceIterator`` builds itself with default options. The log line
``Failed to send RPC to coordination service`` seen meanwhile is a side effect
(the other worker has already exited), not the cause.

:func:`avoid_teardown_stall` switches autotuning off for both. Nothing is lost
on the strategy's side: its per-device dataset is only a fixed-size prefetch.
In your own pipeline, ``map(..., num_parallel_calls=tf.data.AUTOTUNE)`` keeps a
default parallelism that nothing tunes any more (give it a number if the map is
slow); ``prefetch(tf.data.AUTOTUNE)`` keeps its own older buffer tuning
(``legacy_autotune`` in ``tensorflow/python/data/ops/prefetch_op.py``).

Workers started by mwhelpers get the fix without calling anything: their
start-up (``_bootstrap.py``) calls :func:`install_import_hook`, which waits
for TensorFlow to load MultiWorkerMirroredStrategy and then makes every
dataset that strategy distributes (``experimental_distribute_dataset``, which
``fit`` uses, and ``distribute_datasets_from_function``) and its per-device
iterators run without autotuning.  The worker's log says so in one line.
When this TensorFlow's private names are missing or take other arguments,
nothing is changed and the log says that instead, in one line: the
workaround never stops a program from running.
``MWHELPERS_STALL_FIX=0`` (or ``%%worker --no-stall-fix``,
``rt.defaults.stall_fix = False``) turns that off.

This file imports only the standard library at module level, so the worker
start-up can load it by path without the mwhelpers package.
"""

from __future__ import annotations

import importlib.abc
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Protocol

_PATCHED = "_mwhelpers_no_autotune"


class Dataset(Protocol):
    """What this file calls on a ``tf.data.Dataset`` (defined here, so that the annotations
    of :func:`avoid_teardown_stall` resolve without TensorFlow)."""

    def with_options(self, options: object) -> Dataset: ...


def _no_autotune_options() -> object:
    """A ``tf.data.Options`` with autotuning off."""
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    return options


def _patch_device_datasets() -> bool:
    """Make the per-device datasets of MultiDeviceIterator run without autotuning."""
    try:
        from tensorflow.python.data.ops import multi_device_iterator_ops as mdi

        original = mdi._create_device_dataset
    except (ImportError, AttributeError):
        return False
    if not getattr(original, _PATCHED, False):
        def create_device_dataset(*args: object, **kwargs: object) -> Dataset:
            dataset: Dataset = original(*args, **kwargs)
            return dataset.with_options(_no_autotune_options())

        setattr(create_device_dataset, _PATCHED, True)
        create_device_dataset.__wrapped__ = original  # type: ignore[attr-defined]
        mdi._create_device_dataset = create_device_dataset
    return True


def avoid_teardown_stall(dataset: Dataset | None = None) -> Dataset | None:
    """Switch off tf.data autotuning in the strategy's per-device iterators and,
    when given, in ``dataset`` (returned with the option set).

    Call it after importing TensorFlow and before ``fit``. Calling it again is
    harmless.
    """
    if not _patch_device_datasets():
        warnings.warn(
            "mwhelpers.avoid_teardown_stall: this TensorFlow has no "
            "multi_device_iterator_ops._create_device_dataset; the strategy's per-device "
            "iterators keep autotuning, so fit may still stall at its end",
            RuntimeWarning, stacklevel=2,
        )
    if dataset is not None:
        return dataset.with_options(_no_autotune_options())
    return None


# -- the automatic fix in workers started by mwhelpers -----------------------------------

MWMS_MODULE = "tensorflow.python.distribute.collective_all_reduce_strategy"
STALL_FIX_ENV = "MWHELPERS_STALL_FIX"
NOTICE = ("[mwhelpers] tf.data autotuning is off for this MultiWorkerMirroredStrategy input "
          "pipeline so that fit ends when training ends (keep it: MWHELPERS_STALL_FIX=0)")
SKIPPED = ("[mwhelpers] the end-of-fit stall workaround is not applied, tf.data autotuning "
           "stays on ({why}); the program runs unchanged, but fit may linger after its last step")
# The private methods wrapped, with the name of the argument after ``self`` that each takes.
WRAPPED = (("_experimental_distribute_dataset", "dataset"),
           ("_distribute_datasets_from_function", "dataset_fn"))
_said: set[str] = set()


def _say_once(key: str, line: str) -> None:
    if key not in _said:
        _said.add(key)
        print(line, file=sys.stderr, flush=True)


def _tf_version() -> str:
    module = sys.modules.get("tensorflow")
    version = getattr(module, "__version__", None) or getattr(
        getattr(module, "version", None), "VERSION", None)
    return f"TensorFlow {version}" if version else "this TensorFlow"


def _why_not(ext: object) -> str | None:
    """Why ``ext`` (CollectiveAllReduceExtended) cannot be wrapped safely, or None."""
    import inspect

    if ext is None:
        return f"{_tf_version()} has no CollectiveAllReduceExtended"
    for name, argument in WRAPPED:
        method = getattr(ext, name, None)
        if not callable(method):
            return f"{_tf_version()} has no CollectiveAllReduceExtended.{name}"
        try:
            params = list(inspect.signature(method).parameters)
        except (TypeError, ValueError):
            params = []
        if params[:2] != ["self", argument]:
            return (f"{_tf_version()}'s CollectiveAllReduceExtended.{name} takes "
                    f"({', '.join(params)}), not (self, {argument}, ...)")
    return None


def _without_autotune(dataset: Dataset) -> Dataset:
    """``dataset`` with autotuning off, or unchanged (and said why) when that cannot be done."""
    if not _patch_device_datasets():
        # Both iterators must stop autotuning; the user's alone does not end the stall.
        _say_once("skipped", SKIPPED.format(
            why=f"{_tf_version()} has no multi_device_iterator_ops._create_device_dataset"))
        return dataset
    try:
        dataset = dataset.with_options(_no_autotune_options())
    except Exception as e:  # never break the program for a workaround
        _say_once("skipped", SKIPPED.format(why=f"with_options failed: {type(e).__name__}: {e}"))
        return dataset
    _say_once("notice", NOTICE)
    return dataset


def patch_mwms(module: ModuleType) -> bool:
    """Make MWMS distribute datasets (and iterate per device) without autotuning.

    Returns True when patched.  When this TensorFlow's private methods are
    missing or take other arguments, nothing is changed, the log says so in
    one line, and False is returned: the program runs as without mwhelpers.
    """
    ext = getattr(module, "CollectiveAllReduceExtended", None)  # TensorFlow's private class
    if getattr(ext, _PATCHED, False):
        return False
    why = _why_not(ext)
    if why or ext is None:  # (_why_not says why when there is no class)
        _say_once("skipped", SKIPPED.format(why=why))
        return False
    distribute = ext._experimental_distribute_dataset
    from_function = ext._distribute_datasets_from_function

    def _experimental_distribute_dataset(self: object, dataset: Dataset, *args: object,
                                         **kwargs: object) -> object:
        return distribute(self, _without_autotune(dataset), *args, **kwargs)

    def _distribute_datasets_from_function(self: object, dataset_fn: Callable[[object], Dataset],
                                           *args: object, **kwargs: object) -> object:
        return from_function(self, lambda ctx: _without_autotune(dataset_fn(ctx)), *args, **kwargs)

    ext._experimental_distribute_dataset = _experimental_distribute_dataset
    ext._distribute_datasets_from_function = _distribute_datasets_from_function
    setattr(ext, _PATCHED, True)
    return True


def _patch_safely(module: ModuleType) -> None:
    try:
        patch_mwms(module)
    except Exception as e:  # a TensorFlow we do not know: run the program unpatched
        _say_once("skipped", SKIPPED.format(why=f"{type(e).__name__}: {e}"))


def wrapped_spec(finder: object, fullname: str, path: Sequence[str] | None,
                 target: ModuleType | None,
                 around: Callable[[Callable[[ModuleType], None], ModuleType], None]) -> ModuleSpec | None:
    """The spec that the finders on ``sys.meta_path`` other than ``finder`` give for
    ``fullname``, its loader's ``exec_module`` replaced by ``around(exec_module, module)``;
    None when none gives one whose loader can be wrapped (the import then goes on as usual).
    Shared by the start-up's import hooks (also :mod:`lazyplot`'s)."""
    for other in sys.meta_path:
        if other is finder or not hasattr(other, "find_spec"):
            continue
        spec = other.find_spec(fullname, path, target)
        if spec is not None:
            break
    else:
        return None
    loader = spec.loader
    if loader is None or not hasattr(loader, "exec_module"):
        return None
    run = loader.exec_module
    loader.exec_module = lambda module: around(run, module)  # type: ignore[method-assign]  # this loader's, once
    return spec


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs each of ``callbacks(module)`` right after the module ``name`` is first executed."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.callbacks: list[Callable[[ModuleType], object]] = []

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname != self.name:
            return None

        def around(run: Callable[[ModuleType], None], module: ModuleType) -> None:
            run(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            for callback in self.callbacks:
                callback(module)

        return wrapped_spec(self, fullname, path, target, around)


def switched_on(environ: Mapping[str, str], name: str) -> bool:
    """False when the switch ``name`` says off (0, false, no, off); on by default. The start-up
    reads its switches with this (settings.switch reads them the same way in the kernel)."""
    return environ.get(name, "1").strip().lower() not in ("0", "false", "no", "off")


def stall_fix_wanted(environ: Mapping[str, str]) -> bool:
    """False when ``MWHELPERS_STALL_FIX`` says off; on by default."""
    return switched_on(environ, STALL_FIX_ENV)


def after_import(name: str, callback: Callable[[ModuleType], object]) -> None:
    """Call ``callback(module)`` once the module ``name`` has been executed (now, when it
    already has been).  A callback registered again for the same name (the same function, or
    a wrapper whose ``__wrapped__`` is the same function) is not added twice."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    finder = next((f for f in sys.meta_path if isinstance(f, _AfterImport) and f.name == name),
                  None)
    if finder is None:
        finder = _AfterImport(name)
        sys.meta_path.insert(0, finder)
    same = getattr(callback, "__wrapped__", callback)
    if all(getattr(c, "__wrapped__", c) is not same for c in finder.callbacks):
        finder.callbacks.append(callback)


def install_import_hook() -> bool:
    """Patch MultiWorkerMirroredStrategy as soon as TensorFlow loads it (or now)."""
    after_import(MWMS_MODULE, _patch_safely)
    return True
