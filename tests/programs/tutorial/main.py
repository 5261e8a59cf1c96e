# The worker program of the multi-worker Keras tutorial, in its shape: TF_CONFIG read for the
# number of workers, the strategy created before any op, global batch = per-worker batch x
# workers, the model built and compiled in the strategy's scope, fit with steps_per_epoch.
# Nothing here knows about mwhelpers. Arguments (optional): EPOCHS STEPS_PER_EPOCH.
import json
import os
import sys

import mnist_setup
import tensorflow as tf

per_worker_batch_size = 64
tf_config = json.loads(os.environ["TF_CONFIG"])
num_workers = len(tf_config["cluster"]["worker"])

strategy = tf.distribute.MultiWorkerMirroredStrategy()

global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = mnist_setup.mnist_dataset(global_batch_size)

with strategy.scope():
    multi_worker_model = mnist_setup.build_and_compile_cnn_model()

epochs, steps = (int(a) for a in sys.argv[1:3]) if len(sys.argv) > 2 else (3, 70)
multi_worker_model.fit(multi_worker_dataset, epochs=epochs, steps_per_epoch=steps)
