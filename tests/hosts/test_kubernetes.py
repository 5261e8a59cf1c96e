"""Kubernetes: the pods of a job that write_kubernetes wrote, run on the test hosts as a kubelet
runs them (tests/kubepods.py): each in its own network namespace, with its host name, its
index, its volumes and an /etc/hosts that plays the cluster's DNS.

(The manifests against Kubernetes' schemas: tests/inprocess/test_kubernetes_manifests.py.)
"""

import json
import os
import signal
import textwrap
import time

import pytest
from conftest import ROOT, gone_within
from kubepods import Pods
from test_multihost import JAX_TRAIN, check_trained_on_jax

from mwhelpers.backends.kubernetes import write_kubernetes
from mwhelpers.taskside import jaxgloo
from mwhelpers.taskside.wire import ExitRecord
from mwhelpers.workshop.testhosts import missing

REASON = missing(slurm=True)  # (the session's test hosts come with Slurm)
if REASON and os.environ.get("CI") == "true":
    raise RuntimeError(f"CI must run the multi-host tests, but: {REASON}")
pytestmark = [pytest.mark.skipif(bool(REASON), reason=REASON), pytest.mark.xdist_group("testhosts")]

TUTORIAL = ROOT / "tests" / "programs" / "tutorial"


@pytest.fixture
def pods(hosts, tmp_path):
    """Pods(manifest): the job's pods on the test hosts, all ended after the test."""
    made = []

    def make(manifest):
        made.append(Pods(hosts, manifest, tmp_path / f"pods{len(made)}"))
        return made[-1]

    yield make
    for job in made:
        job.end()
    assert gone_within(hosts, 10)


def wait_for_line(pod, text, timeout):
    deadline = time.monotonic() + timeout
    while text not in pod.output:
        assert pod.proc.poll() is None, pod.output
        assert time.monotonic() < deadline, pod.output
        time.sleep(0.1)


def test_the_pods_train_the_tutorial_job_the_first_waiting_for_the_others_name(pods, tmp_path):
    """The tutorial's program and its module, two pods: pod 0 starts alone and waits for pod
    1's name; once pod 1 has an address, both form the cluster by their DNS names and train."""
    manifest = write_kubernetes(tmp_path / "job.yaml", TUTORIAL / "main.py",
                                files=[TUTORIAL / "mnist_setup.py"], image="(this machine's)",
                                job_name="tutorial", args=[2, 5], claim="shared")
    job = pods(manifest)
    first = job.start(0)
    wait_for_line(first, "waiting up to 300 s for these pods' names to resolve: tutorial-1.tutorial",
                  30)
    second = job.start(1)
    assert first.wait(240) == 0, first.output[-4000:]
    assert second.wait(60) == 0, second.output[-4000:]
    workers = ["tutorial-0.tutorial:2222", "tutorial-1.tutorial:2222"]
    for i, pod in enumerate((first, second)):
        out = pod.output
        config = json.loads(out.split(f"[pod tutorial-{i}] TF_CONFIG=", 1)[1].split("\n", 1)[0])
        assert config == {"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}}
        assert ("every pod's name resolves" in out) == (i == 0)  # pod 1 found both at once
        assert "Epoch 2/2" in out and "5/5" in out, out[-3000:]
        assert pod.message == ""  # a program that succeeds leaves no record
        assert not list(pod.tmp.glob("mwhelpers-*"))  # the start-up's folder went with it


def test_the_pods_train_keras3_on_jax_by_their_dns_names(pods, tmp_path):
    """keras.distribution on JAX: the coordinator at pod 0's DNS name, gloo on each pod's."""
    manifest = write_kubernetes(tmp_path / "job.yaml", JAX_TRAIN, image="i", job_name="jax",
                                env={"KERAS_BACKEND": "jax"}, args=["--epochs", 2, "--steps", 4])
    job = pods(manifest)
    started = [job.start(0), job.start(1)]
    for pod in started:
        assert pod.wait(240) == 0, pod.output[-4000:]
    res = {}
    for i, pod in enumerate(started):
        line = next(ln for ln in pod.output.splitlines() if ln.startswith("RESULT "))
        res[f"worker:{i}"] = json.loads(line[len("RESULT "):])
        assert jaxgloo.NOTICE.format(host=f"jax-{i}.jax") in pod.output
    check_trained_on_jax(res)


def test_a_pod_whose_program_raises_puts_its_exit_record_in_the_termination_message(pods, tmp_path):
    (tmp_path / "fails.py").write_text(textwrap.dedent("""
        import socket
        print("HOST", socket.gethostname(), flush=True)
        def odd(n):
            if n == 0:
                raise ValueError("bad input at the bottom")
            even(n - 1)
        def even(n):
            odd(n - 1)
        odd(200)  # a traceback of 200 frames: far more than a termination message keeps
    """))
    job = pods(write_kubernetes(tmp_path / "job.yaml", tmp_path / "fails.py", image="i", tasks=1,
                                job_name="solo"))
    pod = job.start(0)
    assert pod.wait(60) == 1, pod.output
    assert "HOST solo-0" in pod.output  # the pod's host name
    assert len(pod.message.encode()) <= 4096  # what the kubelet keeps of it
    record = ExitRecord.loads(pod.message)
    assert record is not None, pod.message[:500]
    assert (record.type, record.message, record.exit_code) == (
        "ValueError", "bad input at the bottom", 1)
    # the traceback's end: where it was raised
    assert record.traceback.endswith('line 6, in odd\n    raise ValueError("bad input at the '
                                     'bottom")\nValueError: bad input at the bottom\n')
    assert "Traceback" not in record.traceback  # (its start is what went)
    assert not list(pod.tmp.glob("mwhelpers-*"))  # the record's folder went once it was read


def test_a_pod_whose_peer_never_gets_a_name_says_which_and_what_to_check(pods, tmp_path):
    (tmp_path / "main.py").write_text("print('RAN')\n")
    job = pods(write_kubernetes(tmp_path / "job.yaml", tmp_path / "main.py", image="i", tasks=2,
                                job_name="lonely", peer_timeout=2))
    pod = job.start(0)  # pod 1 never runs: no address, no name
    t = time.monotonic()
    assert pod.wait(30) == 3, pod.output
    assert 2 <= time.monotonic() - t < 15
    assert "RAN" not in pod.output
    says = "after 2 s these pods' names still do not resolve: lonely-1.lonely."
    assert says in pod.output
    record = ExitRecord.loads(pod.message)
    assert record is not None and record.type == "TimeoutError" and says in record.message
    assert "kubectl get pods -l app.kubernetes.io/name=lonely" in record.message


def test_sigterm_to_a_pod_reaches_its_program_which_sees_the_pods_files_read_only(pods, tmp_path):
    """The kubelet stops a container with SIGTERM to its first process, the start-up: it passes
    it on to the program, whose exit by that signal is the pod's (143)."""
    (tmp_path / "waits.py").write_text(textwrap.dedent("""
        import json, os, time
        try:
            open("/opt/program/new.txt", "w")
            writable = True
        except OSError:
            writable = False
        print("READY " + json.dumps({"cwd": os.getcwd(), "files": sorted(os.listdir("/opt/program")),
              "writable": writable, "index": os.environ["JOB_COMPLETION_INDEX"]}), flush=True)
        time.sleep(120)
    """))
    (tmp_path / "util.py").write_text("")
    job = pods(write_kubernetes(tmp_path / "job.yaml", tmp_path / "waits.py", image="i", tasks=1,
                                job_name="stop", files=[tmp_path / "util.py"],
                                cwd="/mnt/shared/run", claim="c"))
    pod = job.start(0)
    wait_for_line(pod, "READY ", 30)
    seen = json.loads(pod.output.split("READY ", 1)[1].split("\n", 1)[0])
    assert seen == {"cwd": "/mnt/shared/run", "files": ["util.py", "waits.py"], "writable": False,
                    "index": "0"}
    os.kill(pod.first_process(), signal.SIGTERM)  # to its PID 1, as the kubelet does
    assert pod.wait(10) == 128 + signal.SIGTERM, pod.output
    assert pod.message == ""


def test_sigterm_to_a_pod_still_waiting_for_its_peers_ends_it_at_once(pods, tmp_path):
    """PID 1 gets only the signals it handles: the start-up handles SIGTERM from its start, so
    a pod deleted while it waits for the others' names ends then, not 30 s later by SIGKILL."""
    (tmp_path / "main.py").write_text("print('RAN')\n")
    job = pods(write_kubernetes(tmp_path / "job.yaml", tmp_path / "main.py", image="i", tasks=2,
                                job_name="early"))
    pod = job.start(0)
    wait_for_line(pod, "waiting up to 300 s for these pods' names to resolve", 30)
    os.kill(pod.first_process(), signal.SIGTERM)
    assert pod.wait(10) == 128 + signal.SIGTERM, pod.output  # not the kubelet's 30 s later
    assert "RAN" not in pod.output
