"""Test hosts themselves: several sets up at once (the suite beside the tests, two test
processes) share this machine's sshd folder and subnets without breaking each other."""

import os
import subprocess

import pytest

from mwhelpers.workshop import testhosts
from mwhelpers.workshop.testhosts import TestHosts, missing

REASON = missing()
if REASON and os.environ.get("CI") == "true":
    raise RuntimeError(f"CI must run the test-host tests: {REASON}")
# in the test-host tests' process: no other set of this process is up meanwhile
pytestmark = [pytest.mark.skipif(bool(REASON), reason=REASON), pytest.mark.xdist_group("testhosts")]


def test_the_set_that_made_sshds_folder_can_go_down_first(tmp_path):
    had_privsep = testhosts.PRIVSEP.exists()
    with TestHosts(1, workdir=tmp_path / "a") as a, TestHosts(1, workdir=tmp_path / "b") as b:
        assert a.prefix != b.prefix and a.subnet != b.subnet
        assert testhosts.PRIVSEP.is_dir()
        for h in (a, b):
            done = h.ssh(h.names[0], "true")
            assert done.returncode == 0, done.stderr
        a.down()  # a came first: it made /run/sshd if nobody had
        assert not (tmp_path / "a").exists()
        done = b.ssh(b.names[0], "true")
        assert done.returncode == 0, done.stderr + b.log_tails()  # b's sshd still accepts
    assert testhosts.PRIVSEP.exists() == had_privsep  # the last one down put things back
    if not had_privsep:
        assert not testhosts.USERS.exists()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert a.bridge not in links and b.bridge not in links


def test_each_host_has_its_own_temporary_folder_which_goes_with_the_hosts(tmp_path):
    """The hosts share this machine's /tmp; a task killed there leaves its temporary files
    (TensorFlow's autograph modules). Each host's sessions get a TMPDIR of their own instead,
    inside the set's folder, as another machine has its own /tmp."""
    with TestHosts(2, workdir=tmp_path / "set") as h:
        seen = {}
        for name in h.names:
            done = h.ssh(name, "python3 -c 'import tempfile; print(tempfile.gettempdir())'")
            assert done.returncode == 0, done.stderr
            seen[name] = done.stdout.strip()
            assert seen[name] == str(tmp_path / "set" / "tmp" / name)
        assert len(set(seen.values())) == 2
        done = h.ssh(h.names[0], "touch \"$TMPDIR/left-by-a-killed-task\"")
        assert done.returncode == 0, done.stderr
    assert not (tmp_path / "set").exists()  # and it went with them
