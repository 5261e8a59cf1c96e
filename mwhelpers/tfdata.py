"""Make a multi-worker ``fit`` end when its training ends.

Measured on TF 2.21 (see notebooks/03 and benchmarks/bench_suite.py): at the
end of ``model.fit`` under MultiWorkerMirroredStrategy, a worker often sits
8 to 20 s in the destructor of a tf.data iterator before ``fit`` returns.
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
In your own pipeline, give ``prefetch``/``map`` explicit sizes instead of
``tf.data.AUTOTUNE``, since autotuning no longer picks them.
"""

import warnings

_PATCHED = "_mwhelpers_no_autotune"


def _no_autotune_options():
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    return options


def avoid_teardown_stall(dataset=None):
    """Switch off tf.data autotuning in the strategy's per-device iterators and,
    when given, in ``dataset`` (returned with the option set).

    Call it after importing TensorFlow and before ``fit``. Calling it again is
    harmless.
    """
    try:
        from tensorflow.python.data.ops import multi_device_iterator_ops as mdi

        original = mdi._create_device_dataset
    except (ImportError, AttributeError):
        warnings.warn(
            "mwhelpers.tfdata.avoid_teardown_stall: this TensorFlow has no "
            "multi_device_iterator_ops._create_device_dataset; the strategy's per-device "
            "iterators keep autotuning, so fit may still stall at its end",
            RuntimeWarning, stacklevel=2,
        )
    else:
        if not getattr(original, _PATCHED, False):
            def create_device_dataset(*args, **kwargs):
                return original(*args, **kwargs).with_options(_no_autotune_options())

            setattr(create_device_dataset, _PATCHED, True)
            create_device_dataset.__wrapped__ = original
            mdi._create_device_dataset = create_device_dataset
    if dataset is not None:
        return dataset.with_options(_no_autotune_options())
    return None
