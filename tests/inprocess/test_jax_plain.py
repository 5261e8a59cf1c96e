"""Keras 3 on JAX across processes (keras.distribution), launched by mwhelpers.

Here: the tests of test_jax that need neither TensorFlow, kernels nor hosts; the module's text
and its other tests are in tf/test_jax.py."""

from test_jax import CLUSTER, PROGRAMS, look


def test_a_jax_program_that_leaves_the_variables_to_mwhelpers_gets_no_warning():
    assert look((PROGRAMS / "jax_train.py").read_text()) == []
    assert look("import jax\njax.distributed.initialize()\n") == []
    # The cluster's own values, written in: nothing differs.
    assert look("""
        import keras
        keras.distribution.initialize("localhost:2001,localhost:2002", num_processes=2)
    """) == []


def test_hard_coded_addresses_count_and_id_are_warned_about():
    (warning,) = look("""
        import keras
        keras.distribution.initialize(job_addresses="10.0.0.1:1234,10.0.0.2:2345")
    """)
    assert warning.startswith("train.py line 3 gives keras.distribution/JAX job_addresses="
                              "'10.0.0.1:1234,10.0.0.2:2345', but the cluster gives worker:0 "
                              "and worker:1 localhost:2001,localhost:2002")
    assert "replaces what mwhelpers gives" in warning
    count, process = look("""
        import jax
        jax.distributed.initialize("localhost:2001", 4, process_id=0)
    """)
    assert "num_processes=4, but the cluster gives worker:0 and worker:1 2 " in count
    assert "process_id=0, but the cluster gives worker:1 1 " in process
    (warning,) = look("""
        from keras import distribution
        distribution.initialize(process_id=0)
    """)
    assert "process_id=0, but the cluster gives worker:1 1 " in warning
    (warning,) = look("""
        import os, keras
        os.environ["KERAS_DISTRIBUTION_NUM_PROCESSES"] = "8"
        keras.distribution.initialize()
    """)
    assert warning.startswith("train.py line 3 gives keras.distribution/JAX num_processes='8'")


def test_a_jax_program_launched_as_ps_or_evaluator_is_warned_about():
    (warning,) = look("import keras\nkeras.distribution.initialize()\n",
                      {**CLUSTER, "ps:0": {}, "evaluator:0": {}})
    assert warning == (
        "train.py line 2 calls keras.distribution.initialize, and ps:0 and evaluator:0 are not "
        "processes of Keras 3 on JAX (only the chief and the workers are): such a task gets no "
        "KERAS_DISTRIBUTION_* variables, and JAX there fails with 'coordinator_address should "
        "be defined'. Launch this program as the chief and worker tasks only.")
    # A TensorFlow program as ps is the usual thing: nothing said.
    assert look("import tensorflow as tf\n", {"ps:0": {}}) == []


def test_a_fetch_of_a_variable_split_over_processes_is_explained_and_nothing_else_is():
    from mwhelpers import jaxdiagnosis

    raised = ("RuntimeError: Fetching value for `jax.Array` that spans non-addressable (non "
              "process local) devices is not possible. You can use `jax.experimental...")
    key, cause, advice = jaxdiagnosis.fetched_split("worker:1", raised)
    assert key == "jax-fetch-split" and cause.startswith("worker:1 asked for the whole value")
    assert "OrbaxCheckpoint" in advice and "process_allgather" in advice
    assert jaxdiagnosis.fetched_split("worker:1", "RuntimeError: something else") is None


def test_a_relative_orbax_folder_is_explained_from_the_raise_or_the_log():
    from mwhelpers import jaxdiagnosis

    saving = "ValueError: Checkpoint path should be absolute. Got ckpt/0.orbax-checkpoint-tmp/x"
    key, cause, advice = jaxdiagnosis.orbax_relative("worker:0", saving, [])
    assert key == "orbax-relative-path" and "(ckpt/0.orbax-checkpoint-tmp/x)" in cause
    logged = ["WARNING:absl:Failed to get metadata", "Error details: Checkpoint path should be "
              "absolute. Got ckpt/1/pytree", "Traceback (most recent call last):"]
    raised = "AttributeError: 'NoneType' object has no attribute 'items'"
    assert "(ckpt/1/pytree)" in jaxdiagnosis.orbax_relative("worker:0", raised, logged)[1]
    assert "os.path.abspath" in advice
    assert jaxdiagnosis.orbax_relative("worker:0", raised, ["nothing about paths"]) is None


def test_the_orbax_folder_check_names_only_a_relative_local_folder(tmp_path, monkeypatch):
    from pathlib import Path

    from mwhelpers.taskside.kerasorbax import PREFIX, relative

    monkeypatch.chdir(tmp_path)
    for given in ("ckpt", Path("runs") / "ckpt", "./ckpt"):
        line = relative(given)
        assert line.startswith(PREFIX) and "is relative" in line, given
        assert repr(str(tmp_path / given).replace("/./", "/")) in line, line
    for given in (str(tmp_path / "ckpt"), tmp_path, "gs://bucket/ckpt", None, 3):
        assert relative(given) is None, given
