"""Arms mwhelpers' Keras mends in every Python process started with this folder on
PYTHONPATH, as ``fix_keras_multi_worker()`` does in a user's program: Keras's own tests, and
the worker processes they start, then run against the mended Keras (tests/reproducers/test_keras_lane.py)."""

from mwhelpers.taskside.kerasfix import fix_keras_multi_worker

if not fix_keras_multi_worker():
    raise RuntimeError("the Keras mends are off here (MWHELPERS_KERAS_FIX=0)")
