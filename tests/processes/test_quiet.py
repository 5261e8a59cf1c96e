"""Cells show a task's own output and TF's warnings, not TF's informational C++ lines;
the log keeps everything."""

import pytest

from mwhelpers.failures import WorkerFailed
from mwhelpers.logs import QuietFilter

# The start of a real MWMS worker's log on this machine (TF 2.21, CPU only), and its end.
START = """\
WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1795362803.177125   26599 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.
I0000 00:00:1795362803.230467   26599 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use available CPU instructions in performance-critical operations.
To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with the appropriate compiler flags.
E0000 00:00:1795362805.981434   26599 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)
I0000 00:00:1795362805.988331   26599 grpc_server_lib.cc:467] Started server with target: grpc://localhost:25353
I0000 00:00:1795362806.025805   26613 coordination_service.cc:505] Example stragglers:
/job:worker/replica:0/task:1
W0000 00:00:1795362809.360557   26599 dataset.cc:997] Input of GeneratorDatasetOp::Dataset will not be optimized.
E0000 00:00:1795362810.000001   26599 collective_ops.cc:12] Collective ops is aborted by: peer lost
Epoch 1/2
10/10 - 0s - loss: 6.1176 - 414ms/epoch - 41ms/step
"""  # noqa: E501


def test_the_filter_keeps_the_program_and_tfs_warnings_and_errors():
    f = QuietFilter()
    shown = [ln for ln in START.splitlines() if f.keep(ln)]
    assert shown == [
        "W0000 00:00:1795362809.360557   26599 dataset.cc:997] Input of GeneratorDatasetOp::Dataset "
        "will not be optimized.",
        "E0000 00:00:1795362810.000001   26599 collective_ops.cc:12] Collective ops is aborted by: "
        "peer lost",
        "Epoch 1/2",
        "10/10 - 0s - loss: 6.1176 - 414ms/epoch - 41ms/step",
    ]
    assert f.hidden == 8


def test_a_program_line_after_a_hidden_record_is_shown():
    f = QuietFilter()
    assert not f.keep("I0000 00:00:1795362805.988331   26599 grpc_server_lib.cc:467] Started server")
    assert f.keep("To enable something: the program said this, not TF")  # no continuation form
    assert f.keep("/job:worker/replica:0/task:1")  # only right after a hidden record


def test_jax_gloo_lines_stay_in_the_log():
    from mwhelpers.taskside import jaxgloo

    f = QuietFilter()
    assert not f.keep(jaxgloo.NOTICE.format(host="10.0.0.1"))
    assert not f.keep("[Gloo] Rank 1 is connected to 1 peer ranks. Expected number of connected "
                      "peer ranks is : 1")
    assert f.keep("Epoch 1/2")


PROGRAM = ("import sys\nsys.stdout.write(" + repr(START) + ")\n"
           "sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)\n")


def test_the_cell_is_quiet_and_the_log_complete(rt, write):
    script = write("noisy.py", PROGRAM)
    run = rt.launch("worker:0", script=str(script))
    streamed = [ln for ln in rt.echo_lines if ln.startswith("[worker:0] ")]
    assert "[worker:0] Epoch 1/2" in streamed and len(streamed) == 4
    assert not any("Started server" in ln or "cuInit" in ln for ln in streamed)
    assert run.lines() == START.splitlines()


def test_verbose_shows_everything(rt, write):
    script = write("noisy.py", PROGRAM)
    rt.launch("worker:0", script=str(script), verbose=True)
    assert len([ln for ln in rt.echo_lines if ln.startswith("[worker:0] ")]) == 12
    rt.echo_lines.clear()
    rt.verbose = True  # for every launch of this kernel
    rt.launch("worker:0", script=str(script))
    assert any("Started server with target" in ln for ln in rt.echo_lines)


def test_the_magic_option_and_the_failure_report_are_unfiltered(ip, rt, write):
    script = write("noisy.py", PROGRAM)
    with pytest.raises(WorkerFailed) as info:
        rt.launch("worker:0", script=str(script), args=["3"])
    assert "grpc_server_lib.cc:467] Started server" in str(info.value)  # the log tail, whole
    rt.echo_lines.clear()
    ip.run_line_magic("worker", f"0 --verbose {script}")
    assert any("cpu_feature_guard" in ln for ln in rt.echo_lines)
