"""write_kubernetes: the manifests validate against Kubernetes' own schemas of the versions we
name, say what Kubernetes needs to give each pod its name, and carry the files exactly.

(The pods' start-up runs for real on the test hosts: tests/hosts/test_kubernetes.py.)
"""

import json
import os

import pytest
import yaml

from mwhelpers.backends.kubernetes import start_up_files, to_yaml, write_kubernetes
from mwhelpers.errors import UsageError
from mwhelpers.taskside import wire

try:
    import kubernetes_validate
except ImportError:  # a test dependency (requirements/test.txt)
    kubernetes_validate = None
    if os.environ.get("CI") == "true":
        raise
VERSIONS = ("1.25", "1.30", "1.33", "1.37")  # the validator's oldest schema, to the newest
needs_validator = pytest.mark.skipif(kubernetes_validate is None,
                                     reason="kubernetes-validate is not installed "
                                            "(pip install -r requirements/test.txt)")


@pytest.fixture
def program(tmp_path):
    (tmp_path / "main.py").write_text("import helper\nprint(helper.X)\n")
    (tmp_path / "helper.py").write_text("X = 'it\\'s  \\n here'\n\n\n")
    return tmp_path


def objects(path):
    return {d["kind"] + ("/" + d["metadata"]["name"] if d["kind"] == "ConfigMap" else ""): d
            for d in yaml.safe_load_all(path.read_text()) if d}


@needs_validator
@pytest.mark.parametrize("options", [
    {},
    {"tasks": 4, "args": ["--epochs", 3], "cpus": 2, "memory": "4Gi", "gpus": 1,
     "claim": "checkpoints", "time_limit": 3600, "backoff_limit": 3, "namespace": "ml",
     "env": {"TF_CPP_MIN_LOG_LEVEL": "2", "KERAS_BACKEND": "jax"}, "port": 23456,
     "cwd": "/mnt/shared/run1"},
], ids=["defaults", "every-option"])
def test_the_manifests_validate_strictly_against_each_named_kubernetes(program, options):
    path = write_kubernetes(program / "job.yaml", program / "main.py", files=[program / "helper.py"],
                            image="tensorflow/tensorflow:2.21.0", **options)
    for doc in yaml.safe_load_all(path.read_text()):
        for version in VERSIONS:  # raises ValidationError saying which field and why
            kubernetes_validate.validate(doc, version, strict=True)


@needs_validator
def test_the_validator_refuses_what_kubernetes_would(program):
    """The check can fail: a field Kubernetes does not have, a number where it wants text."""
    path = write_kubernetes(program / "job.yaml", program / "main.py", image="python:3.11")
    job = objects(path)["Job"]
    job["spec"]["template"]["spec"]["subDomain"] = "typo"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, "1.37", strict=True)
    job = objects(path)["Job"]
    job["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, "1.37", strict=True)


def test_every_pod_gets_its_name_from_the_headless_service_and_its_index(program):
    path = write_kubernetes(program / "job.yaml", program / "main.py", files=[program / "helper.py"],
                            image="python:3.11", tasks=3, job_name="mnist", args=[2, "x y"])
    found = objects(path)
    job, service = found["Job"], found["Service"]
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 3, 3)
    assert spec["backoffLimit"] == 0  # one failed pod fails the job, which ends the others
    # The Service is headless, named as the pods' subdomain, selects the job's pods by the
    # label the Job controller puts on them, and publishes them before they are ready.
    assert service["metadata"]["name"] == pod["subdomain"] == "mnist"
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"]
    # (the pods' own labels: the Job controller's batch.kubernetes.io/job-name needs 1.27)
    selector = service["spec"]["selector"]
    assert selector == {"app.kubernetes.io/name": "mnist", "app.kubernetes.io/managed-by": "mwhelpers"}
    assert selector.items() <= job["spec"]["template"]["metadata"]["labels"].items()
    assert pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    assert container["command"] == ["python", "-u", "/opt/mwhelpers/_podstart.py",
                                    "/opt/program/main.py", "2", "x y"]
    env = {e["name"]: e["value"] for e in container["env"]}
    shape = json.loads(env[wire.Env.POD])
    assert shape == {"job": "mnist", "service": "mnist", "tasks": 3, "port": 2222,
                     "peer_timeout": 300.0, "termination_log": "/dev/termination-log"}
    assert container["terminationMessagePath"] == shape["termination_log"]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert (env["MWHELPERS_KERAS_FIX"], env["MWHELPERS_STALL_FIX"]) == ("1", "1")
    # The files, exactly: the start-up of this installation and the program with its module.
    assert found["ConfigMap/mnist-mwhelpers"]["data"] == start_up_files()
    assert "_podstart.py" in start_up_files() and not {"_agent.py", "agentwarm.py"} & set(start_up_files())
    assert found["ConfigMap/mnist-program"]["data"] == {
        "main.py": (program / "main.py").read_text(), "helper.py": (program / "helper.py").read_text()}
    volumes = {v["name"]: v["configMap"]["name"] for v in pod["volumes"]}
    assert volumes == {"mwhelpers": "mnist-mwhelpers", "program": "mnist-program"}
    assert "workingDir" not in container and "resources" not in container


def test_a_claim_is_where_the_pods_start_and_gpus_are_limits(program):
    path = write_kubernetes(program / "job.yaml", program / "main.py", image="i", claim="ckpt",
                            gpus=2, cpus=1.5)
    container = objects(path)["Job"]["spec"]["template"]["spec"]["containers"][0]
    assert container["workingDir"] == "/mnt/shared"
    assert {"name": "shared", "mountPath": "/mnt/shared"} in container["volumeMounts"]
    assert container["resources"] == {"requests": {"cpu": "1.5"}, "limits": {"nvidia.com/gpu": 2}}


@pytest.mark.parametrize("bad, says", [
    ({"job_name": "Big_Name"}, "DNS label"),
    ({"job_name": "x" * 62, "tasks": 10}, "at most 63"),
    ({"tasks": 0}, "tasks must be"),
    ({"image": " "}, "image= names"),
    ({"port": 80}, "port must be"),
    ({"gpus": -1}, "gpus must be"),
    ({"files": ["main.py"]}, "given twice"),
    ({"files": ["missing.py"]}, "is not a file"),
])
def test_bad_arguments_say_what_is_wrong_and_write_nothing(program, bad, says, monkeypatch):
    monkeypatch.chdir(program)
    given = {"image": "i", **bad}
    with pytest.raises(UsageError, match=says):
        write_kubernetes(program / "job.yaml", program / "main.py", **given)
    assert not (program / "job.yaml").exists()


def test_a_program_too_large_for_a_config_map_is_refused(program):
    (program / "data.py").write_text("x" * 1_100_000)
    with pytest.raises(UsageError, match="Put data in the image or a volume"):
        write_kubernetes(program / "job.yaml", program / "main.py", image="i",
                         files=[program / "data.py"])


@pytest.mark.parametrize("text", [
    "a\nb", "a\nb\n", "a\n\n", "  indented first\nline\n", "x\n\n\ny", "x\n  \ny", "\n", "é\tz\n",
    "a\r\nb", "\n\nx", "x\n\ty\n", "a\n   b\n\n\n", "nul\x00", "true", "2222", "", "a: b", "#c",
    "- x", "nel\x85\nx", "ls\u2028ps\u2029\n", "del\x7f\n", "c1\x9f", "emoji \U0001f600\n"])
def test_yaml_holds_any_text_exactly(text):
    for value in ({"k": text}, [text, {"a": [text]}], {"a": {"b": [text, text]}, "z": 1}):
        assert yaml.safe_load("\n".join(to_yaml(value)) + "\n") == value
    assert yaml.safe_load("\n".join(to_yaml({text: 1})) + "\n") == {text: 1}


def test_the_kubernetes_magic_writes_the_same_manifests_and_says_how_to_run_them(
        ip, program, capsys, monkeypatch):
    monkeypatch.chdir(program)
    ip.run_line_magic("kubernetes", "--image img:1 --tasks 3 --files helper.py --job-name mnist "
                      "--claim ckpt --gpus 1 --env A=1 --env B=x=y by-magic.yaml main.py 3 -- "
                      "--lr 0.1")
    out = capsys.readouterr().out
    assert "kubectl apply --server-side -f by-magic.yaml" in out
    assert "kubectl logs -f -l app.kubernetes.io/name=mnist --prefix" in out
    called = write_kubernetes("by-call.yaml", "main.py", image="img:1", tasks=3,
                              args=["3", "--lr", "0.1"], files=["helper.py"], job_name="mnist",
                              claim="ckpt", gpus=1, env={"A": "1", "B": "x=y"})
    assert objects(program / "by-magic.yaml") == objects(called)
    with pytest.raises(UsageError, match="--image"):
        ip.run_line_magic("kubernetes", "x.yaml main.py")
