"""Which versions a kernel's environment holds, read from the installed packages' metadata:
nothing is imported (a kernel that only starts workers need not pay for importing TensorFlow).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

# Distributions that install the ``tensorflow`` package: one per environment (two unpack into one
# folder, and the last one installed wins).
TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-intel", "tensorflow-macos",
                    "tensorflow-cpu-aws", "tf-nightly", "tf-nightly-cpu")


def tensorflow_distributions() -> list[tuple[str, str]]:
    """``[(distribution, version)]`` of every installed distribution of TensorFlow."""
    found = []
    for name in TF_DISTRIBUTIONS:
        try:
            found.append((name, version(name)))
        except PackageNotFoundError:
            pass
    return found


def versions(*packages: str) -> str:
    """``"TensorFlow 2.21.0 (tensorflow-cpu) | tf_keras 2.21.0"`` for the packages named
    (``"tensorflow"`` stands for whichever distribution of it is installed); a package that is
    not installed says so, and more than one TensorFlow is named as the problem it is."""
    parts = []
    for name in packages:
        if name == "tensorflow":
            tfs = tensorflow_distributions()
            if not tfs:
                parts.append("TensorFlow not installed")
            elif len(tfs) == 1:
                parts.append(f"TensorFlow {tfs[0][1]} ({tfs[0][0]})")
            else:
                parts.append("TensorFlow: " + " and ".join(f"{n} {v}" for n, v in tfs)
                             + " installed together (one folder; the last installed wins)")
            continue
        try:
            parts.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            parts.append(f"{name} not installed")
    return " | ".join(parts)


def installed(name: str) -> str | None:
    """The installed version of ``name`` (``"tensorflow"``: of whichever distribution of it),
    or None."""
    if name == "tensorflow":
        tfs = tensorflow_distributions()
        return tfs[0][1] if tfs else None
    try:
        return version(name)
    except PackageNotFoundError:
        pass
    if name in ("keras", "tf_keras"):  # keras-nightly, tf-keras-nightly: read the module's files
        from .taskside.taskfacts import module_version

        return module_version(name)
    return None
