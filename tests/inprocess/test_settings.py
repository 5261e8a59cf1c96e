"""The settings table (mwhelpers/settings.py): each variable read and checked in one place, the
guide's list (docs/guide/extension.md) generated from it, and every MWHELPERS_* variable the
package reads listed."""

import re
from pathlib import Path

import pytest
from conftest import ROOT

from mwhelpers import settings
from mwhelpers.errors import UsageError
from mwhelpers.ports import port_range
from mwhelpers.taskside import kerasfix, lazyplot, tfdata


def test_the_extension_guide_lists_the_table():
    text = (ROOT / "docs" / "guide" / "extension.md").read_text()
    shown = text.split("<!-- settings:begin -->\n", 1)[1].split("\n<!-- settings:end -->", 1)[0]
    assert shown == settings.markdown(), "regenerate it: python -m mwhelpers.settings"


def test_every_variable_the_package_reads_is_in_the_table():
    listed = set(settings.BY_NAME) | {name for name, _ in settings.SET_BY_MWHELPERS}
    used = set()
    for path in Path(settings.__file__).parent.rglob("*.py"):
        if "workshop" in path.parts:  # the suite's own mark is not a user's setting
            continue
        used |= set(re.findall(r"MWHELPERS_[A-Z_]*[A-Z]", path.read_text()))
    assert used <= listed, sorted(used - listed)


@pytest.mark.parametrize("name, text, value", [
    ("MWHELPERS_HEARTBEAT", "2.5", 2.5), ("MWHELPERS_HEARTBEAT", "0", 0.0),
    ("MWHELPERS_HEARTBEAT", "", 10.0), ("MWHELPERS_PORT_RANGE", "21000-21100", (21000, 21100)),
    ("MWHELPERS_SSH", "ssh -F 'my config'", ["ssh", "-F", "my config"]),
    ("MWHELPERS_STALL_FIX", "off", False), ("MWHELPERS_KERAS_FIX", " 1 ", True),
    ("MWHELPERS_LOG_DIR", "/tmp/logs", "/tmp/logs"), ("MWHELPERS_PORT_BASE", "24000", 24000),
])
def test_values_are_read_as_their_type(name, text, value):
    assert settings.BY_NAME[name].read({name: text}) == value


@pytest.mark.parametrize("name, text, says", [
    ("MWHELPERS_HEARTBEAT", "0.5", "1 or more; 0 turns the heartbeat off"),
    ("MWHELPERS_HEARTBEAT", "soon", "1 or more"),
    ("MWHELPERS_PORT_RANGE", "30000-20000", "LOW-HIGH with 1024 <= LOW <= HIGH <= 65535"),
    ("MWHELPERS_PORT_RANGE", "20000", "LOW-HIGH"),
    ("MWHELPERS_SSH", "'", "a command"),
    ("MWHELPERS_PORT_BASE", "80", "between 1024 and 65535"),
])
def test_a_bad_value_names_the_variable_and_what_to_give(name, text, says):
    with pytest.raises(UsageError, match=rf"^{name}={re.escape(repr(text))}: give .*{re.escape(says)}"):
        settings.BY_NAME[name].read({name: text})


def test_the_readers_use_the_table(monkeypatch):
    monkeypatch.setenv("MWHELPERS_PORT_RANGE", "21000-21100")
    assert port_range() == (21000, 21100)
    monkeypatch.setenv("MWHELPERS_PORT_RANGE", "nonsense")
    with pytest.raises(UsageError, match="MWHELPERS_PORT_RANGE='nonsense': give LOW-HIGH"):
        port_range()


@pytest.mark.parametrize("text", ["", "1", "0", "off", "No", "false", " 0 ", "yes"])
def test_the_switches_read_inside_workers_agree_with_the_table(text):
    """tfdata.py and kerasfix.py run in workers without the package: they read the switch
    the kernel passed on the same way."""
    env = {"MWHELPERS_STALL_FIX": text, "MWHELPERS_KERAS_FIX": text, "MWHELPERS_LAZY_PYPLOT": text}
    assert tfdata.stall_fix_wanted(env) == settings.STALL_FIX.read(env)
    assert kerasfix.fix_wanted(env) == settings.KERAS_FIX.read(env)
    assert tfdata.switched_on(env, lazyplot.ENV) == settings.LAZY_PYPLOT.read(env)
