"""Reports whether tf.data autotuning is on in the pipelines MWMS builds (no mwhelpers import).

Prints ``RESULT {...}``: the autotune option of the user's dataset as the strategy
distributed it, of the per-device datasets its iterator builds, and of a dataset from
``distribute_datasets_from_function`` (null: TF's default, which is on).
"""
import json

import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
ds = tf.data.Dataset.range(64).batch(8)
dist = strategy.experimental_distribute_dataset(ds)
it = iter(dist)
next(it)
out = {
    "user": [d.options().autotune.enabled for d in dist._cloned_datasets],
    "per_device": [d._dataset.options().autotune.enabled
                   for d in it._iterators[0]._iterator._device_iterators],
}
dist2 = strategy.distribute_datasets_from_function(lambda ctx: tf.data.Dataset.range(8).batch(2))
out["from_function"] = [d.options().autotune.enabled for d in dist2._datasets]
print("RESULT " + json.dumps(out), flush=True)
