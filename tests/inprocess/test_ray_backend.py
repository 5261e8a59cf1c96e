"""The ray backend's decisions, in this process: its options, what it refuses, what it says
about a cluster that takes anyone's code.  (On a real Ray cluster: tests/hosts/test_ray.py and
the conformance suite, tests/processes/test_backends.py.)"""

from pathlib import Path

import pytest
from fakes import FakeLauncher

from mwhelpers.backends import available_backends, options_of, pick_backend
from mwhelpers.backends.raynodes import RayLauncher, RayOptions
from mwhelpers.errors import UsageError
from mwhelpers.taskside import wire
from mwhelpers.workers import Runtime


def test_the_ray_backend_is_built_in_and_address_means_it():
    assert "ray" in available_backends()
    assert list(options_of("ray"))[:5] == ["address", "placement", "cpus", "gpus", "place_timeout"]
    assert pick_backend({"address": "10.0.0.1:6379"}) == "ray"


@pytest.mark.parametrize("given, says", [
    ({"placement": "scatter"}, r"option placement cannot be 'scatter' \(one of spread, pack, "
                               "strict-spread, strict-pack\\)"),
    ({"cpus": -1}, r"option cpus cannot be -1 \(a number, not below 0\)"),
    ({"gpus": True}, r"option gpus cannot be True"),
    ({"place_timeout": "soon"}, r"option place_timeout cannot be 'soon'"),
])
def test_bad_options_are_refused_naming_the_option(given, says):
    with pytest.raises(UsageError, match=says):
        RayOptions.from_given("ray", given)


def test_the_options_convert_what_a_user_gives():
    given = RayOptions.from_given("ray", {"address": " head:6379 ", "placement": "STRICT_PACK",
                                          "cpus": "0.5", "gpus": 1, "place_timeout": "5"})
    assert (given.address, given.placement, given.cpus, given.gpus, given.place_timeout) == (
        "head:6379", "strict-pack", 0.5, 1.0, 5.0)


def test_without_an_address_it_says_where_to_find_one():
    with pytest.raises(UsageError, match=r"--address HOST:PORT .*'ray start --head' printed it, "
                                         r"or \$RAY_ADDRESS"):
        RayLauncher(RayOptions(), environ={})


def test_the_address_comes_from_ray_address_and_python_is_each_nodes_own():
    launcher = RayLauncher(RayOptions(), environ={"RAY_ADDRESS": "10.0.0.1:6379"})
    assert launcher.address == "10.0.0.1:6379" and launcher.python == wire.THIS_PYTHON
    assert launcher.head is None and launcher.notes() == []  # (nothing placed yet)
    launcher.bundle_of["10.0.0.2"], launcher.address_at["10.0.0.2"] = 1, "10.0.0.2"
    launcher._via = Path("/tmp/mwrrTEST/relay")  # the holder's socket (one Ray driver)
    words = launcher.transport("10.0.0.2", ["{python}", "-c", "pass"])
    assert words[words.index("--bundle") + 1] == "1" and words[-3:] == ["{python}", "-c", "pass"]
    assert words[words.index("--via") + 1] == "/tmp/mwrrTEST/relay" and "--address" not in words
    assert words[words.index("--expect") + 1] == "10.0.0.2"  # where the bundle must still be
    # a bundle's GPUs are Ray's: the kernel's CUDA_VISIBLE_DEVICES does not travel
    assert "CUDA_VISIBLE_DEVICES" not in launcher.task_env(
        {"CUDA_VISIBLE_DEVICES": "0", "TF_CPP_MIN_LOG_LEVEL": "2"})
    launcher.token_sent = False  # the holder connected without a token, and was let in
    (note,) = launcher.notes()
    assert "runs code for anyone who reaches its head (CVE-2023-48022)" in note
    assert "RAY_AUTH_MODE=token" in note


class _Noted(FakeLauncher):
    name = "noted"

    def notes(self):
        return ["this cluster is only pretend"]


def test_what_a_backend_notes_is_said_once_the_cluster_is_defined(tmp_path, monkeypatch):
    from mwhelpers.backends import register_backend

    register_backend("noted", _Noted)
    said = []
    rt = Runtime(log_dir=tmp_path / "logs", echo=said.append)
    try:
        rt.define_cluster(2, backend="noted")
    finally:
        rt.close()
    assert said == ["note: this cluster is only pretend"]


def test_a_commands_client_imports_nothing_of_ray_and_says_when_its_driver_is_gone(tmp_path):
    """A command's transport is a client of the cluster's one Ray driver (the holder): it must
    not pay for Ray's import (about 9 CPU-s a command, 2026-11-30, with its own driver and
    actor), and without the holder it says what to do."""
    import subprocess
    import sys

    from mwhelpers.backends.raynodes import RELAY_CODE

    blocked = "import sys; sys.modules['ray'] = None\n"  # any import of Ray now fails
    done = subprocess.run(
        [sys.executable, "-c", blocked + RELAY_CODE, "run", "--via", str(tmp_path / "gone"),
         "--bundle", "0", "--", "true"],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 255, done.stderr
    assert "this cluster's Ray driver is gone" in done.stderr
    assert "define the cluster again (%cluster)" in done.stderr
    assert "ModuleNotFoundError" not in done.stderr and "ImportError" not in done.stderr
