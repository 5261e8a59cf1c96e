"""GPUs per task. No GPU exists on these machines: the assignment is tested with the device
lists a probe returns, and end to end with a stand-in ``nvidia-smi`` on PATH that prints what
the real one prints for ``-L``."""

import textwrap

import pytest

from mwhelpers.errors import UsageError
from mwhelpers.gpus import assign, visible_gpus

NVIDIA_SMI_L = textwrap.dedent("""\
    GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5f0e6b1c-3a1e-2c7e-8b9f-0a1b2c3d4e5f)
    GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-6a1f7c2d-4b2f-3d8f-9c0a-1b2c3d4e5f60)
    GPU 2: NVIDIA A100-SXM4-40GB (UUID: GPU-7b2a8d3e-5c3a-4e9a-0d1b-2c3d4e5f6071)
    GPU 3: NVIDIA A100-SXM4-40GB (UUID: GPU-8c3b9e4f-6d4b-5f0b-1e2c-3d4e5f607182)
""")


@pytest.fixture
def fake_nvidia_smi(tmp_path, monkeypatch):
    """An ``nvidia-smi`` that lists ``n`` GPUs (``-L`` only), first on PATH."""
    def make(n):
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        lines = "".join(NVIDIA_SMI_L.splitlines(keepends=True)[:n])
        tool = bin_dir / "nvidia-smi"
        tool.write_text(f"#!/bin/sh\n[ \"$1\" = -L ] || exit 2\nprintf '%s' '{lines}'\n")
        tool.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return make


def test_visible_gpus_from_the_environment_first_then_nvidia_smi(fake_nvidia_smi):
    fake_nvidia_smi(4)
    assert visible_gpus() == ["0", "1", "2", "3"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3", "PATH": "/usr/bin"}) == ["2", "3"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "1,-1,2"}) == ["1"]  # CUDA stops at -1
    assert visible_gpus({"PATH": "/nonexistent"}) == []  # no nvidia-smi: no GPU


def test_assign_gives_each_task_its_own_slice_per_host():
    hosts = {"worker:0": "a", "worker:1": "b", "worker:2": "a", "worker:3": "b"}
    probes = {"a": ["0", "1", "2", "3"], "b": ["4", "5"]}  # b: its allocation's GPUs
    assert assign(hosts, probes, 1) == {"worker:0": "0", "worker:1": "4", "worker:2": "1",
                                        "worker:3": "5"}
    assert assign({"w0": "a", "w1": "a"}, probes, 2) == {"w0": "0,1", "w1": "2,3"}


def test_assign_refuses_too_few_gpus_naming_the_host(monkeypatch):
    with pytest.raises(UsageError, match=r"b offers GPUs 4, 5 .* 2 task\(s\) \(worker:1, worker:3\) "
                                         r"need 2 each, 4 in all"):
        assign({"worker:0": "a", "worker:1": "b", "worker:2": "a", "worker:3": "b"},
               {"a": ["0", "1", "2", "3"], "b": ["4", "5"]}, 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(UsageError, match=r"this machine offers no GPU \(from CUDA_VISIBLE_DEVICES, "
                                         r"else nvidia-smi -L\)"):
        assign({"worker:0": None}, {None: []}, 1)
    # Where this process's CUDA_VISIBLE_DEVICES decided, the message says so: "" hides every GPU
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(UsageError, match=r"this machine offers no GPU \(this process's "
                                         r"CUDA_VISIBLE_DEVICES is ''\)"):
        assign({"worker:0": None}, {None: []}, 1)
    for bad in (0, -1, 1.5, True, "1"):
        with pytest.raises(UsageError, match="gpus_per_task must be a whole number >= 1"):
            assign({"worker:0": None}, {None: ["0"]}, bad)


PRINT_GPUS = "import os\nprint('sees', repr(os.environ.get('CUDA_VISIBLE_DEVICES')))\n"


def test_each_local_task_gets_its_gpus_and_the_table_shows_them(ip, rt, fake_nvidia_smi, capsys):
    fake_nvidia_smi(4)
    assert ip.run_cell("%cluster 2 --chief --gpus-per-task 1").success
    shown = capsys.readouterr().out
    assert "chief:0   port" in shown and "GPUs 0" in shown and "GPUs 2" in shown
    for task in ("chief:0", "worker:0", "worker:1"):
        assert ip.run_cell(f"%%worker {task}\n{PRINT_GPUS}").success
    assert rt.echo_lines == ["[chief:0] sees '0'", "[worker:0] sees '1'", "[worker:1] sees '2'"]
    table = rt.status()
    assert table.columns[6] == "gpus" and [r[6] for r in table.rows] == ["0", "1", "2"]
    assert "<th>gpus</th>" in table._repr_html_()
    assert "<th>GPUs</th>" in rt.cluster._repr_html_()


def test_too_few_gpus_is_refused_and_nothing_is_defined(ip, rt, fake_nvidia_smi):
    fake_nvidia_smi(2)
    with pytest.raises(UsageError, match=r"this machine offers GPUs 0, 1 .* 3 task\(s\)"):
        ip.run_line_magic("cluster", "3 --gpus-per-task 1")
    assert rt.cluster is None
    with pytest.raises(UsageError, match="invalid int value"):
        ip.run_line_magic("cluster", "2 --gpus-per-task many")


def test_without_gpus_per_task_nothing_changes(ip, rt, fake_nvidia_smi, monkeypatch):
    fake_nvidia_smi(4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # what the notebooks set on CPU machines
    assert ip.run_cell("%cluster 1").success
    assert ip.run_cell(f"%%worker 0\n{PRINT_GPUS}").success
    assert rt.echo_lines == ["[worker:0] sees ''"]
    assert "gpus" not in rt.status().columns
