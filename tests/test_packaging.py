"""The pip path (pyproject.toml + constraints.txt) and environment.yml pin the same versions."""

import re

import tomllib
from conftest import ROOT


def _name(req):
    return re.split(r"[=<>!~;\s]", req, maxsplit=1)[0].lower().replace("_", "-")


def pyproject_pins():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = data["project"]["dependencies"] + data["project"]["optional-dependencies"]["test"]
    return sorted(r.replace(" ", "") for r in reqs)


def environment_pins():
    text = (ROOT / "environment.yml").read_text()
    block = text.split("- pip:", 1)[1]
    pins = []
    for line in block.splitlines():
        m = re.match(r"\s+-\s+(.+)$", line)
        if m and not m.group(1).startswith("-e"):
            pins.append(m.group(1).strip().strip('"').replace(" ", ""))
    return sorted(pins)


def constraint_pins():
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version.strip()
    return pins


def test_every_dependency_is_pinned_exactly():
    for req in pyproject_pins():
        assert "==" in req, f"{req} is not pinned to one version"


def test_environment_yml_names_the_same_versions_as_pyproject():
    assert environment_pins() == pyproject_pins()
    assert "python=3.11" in (ROOT / "environment.yml").read_text()


def test_constraints_agree_with_the_direct_pins():
    locked = constraint_pins()
    for req in pyproject_pins():
        if "sys_platform!='linux'" in req:
            continue  # not installed here, so not in the Linux freeze
        name, version = _name(req), req.split("==")[1].split(";")[0]
        assert locked.get(name) == version, f"{name}: pyproject {version}, constraints {locked.get(name)}"


def test_readme_commands_are_the_ones_ci_runs():
    readme = (ROOT / "README.md").read_text()
    assert "python3 dev.py suite" in readme and "python3 dev.py test" in readme
    assert "python3 dev.py test" in (ROOT / ".ci" / "run").read_text()
