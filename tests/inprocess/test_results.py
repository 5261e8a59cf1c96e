"""Results and progress lines that programs print, read back by the kernel as dicts and a table."""

import pytest

from mwhelpers.errors import UsageError
from mwhelpers.results import Results, last, parse, read_results, records


def test_a_result_line_is_json_and_a_progress_line_is_key_value_pairs():
    assert parse('RESULT {"loss": [2.5, 1.25], "chief": true}') == {"loss": [2.5, 1.25], "chief": True}
    assert parse("STEP 5 loss=0.1234 who=w1", "STEP") == {"step": 5, "loss": 0.1234, "who": "w1"}
    assert parse("STEP epoch=1 batch=2", "STEP") == {"epoch": 1, "batch": 2}
    assert parse("RESULTS are in") is None and parse("Epoch 1/2") is None
    assert records(["STEP 1", "x", "STEP 2 loss=1.5"], "STEP") == [{"step": 1}, {"step": 2, "loss": 1.5}]
    assert last(["RESULT {\"a\": 1}", "RESULT {\"a\": 2}", "done"]) == {"a": 2}
    assert last(["nothing here"]) is None


def test_a_broken_result_line_says_which_line_and_what_is_wrong():
    with pytest.raises(ValueError, match=r"not valid JSON .* RESULT \{\"loss\": \[1,"):
        parse('RESULT {"loss": [1,')


def test_the_table_has_a_row_per_task_and_shortens_what_is_long():
    r = Results({"worker:0": {"chief": True, "history": {"loss": [2.3456, 1.5, 1.1]}, "note": "x" * 50},
                 "worker:1": {"chief": False, "history": {"loss": [2.3456, 1.5, 1.1]}}})
    r.missing.append("worker:2")
    lines = r.table().splitlines()
    assert lines[0].split() == ["task", "chief", "history.loss", "note"]
    assert lines[2].startswith("worker:0  True   2.346 -> 1.1 (3)  xxxxx") and lines[2].endswith("...")
    assert lines[3].split() == ["worker:1", "False", "2.346", "->", "1.1", "(3)"]
    assert lines[-1] == "(no result yet from worker:2)"
    assert "<td>worker:1</td><td>False</td>" in r._repr_html_()
    assert r["worker:0"]["history"]["loss"] == [2.3456, 1.5, 1.1]  # the dict keeps every value


def test_logs_written_without_the_extension(tmp_path):
    (tmp_path / "a.log").write_text('Epoch 1/1\nRESULT {"loss": 1.0}\n')
    (tmp_path / "b.log").write_text("Epoch 1/1\n")
    r = read_results({"worker:0": tmp_path / "a.log", "worker:1": tmp_path / "b.log"})
    assert r == {"worker:0": {"loss": 1.0}} and r.missing == ["worker:1"]


PROGRAM = """\
import json, os
task = json.loads(os.environ["TF_CONFIG"])["task"]
for step in range(3):
    print(f"STEP {step} loss={1.0 / (step + 1):.4f}", flush=True)
print("RESULT " + json.dumps({"index": task["index"], "losses": [1.0, 0.5, 0.3333]}), flush=True)
print("done", flush=True)
"""


def test_the_cell_hides_result_lines_the_log_keeps_them_and_rt_reads_them(ip, rt, write, capsys):
    script = write("report.py", PROGRAM)
    with pytest.raises(UsageError, match="no task has been launched"):
        rt.results()
    ip.run_line_magic("cluster", "2")
    ip.run_line_magic("worker", f"0 --bg {script}")
    ip.run_line_magic("worker", f"1 {script}")
    ip.run_line_magic("waitworkers", "")
    streamed = [ln for ln in rt.echo_lines if ln.startswith("[worker:1] ")]
    assert "[worker:1] STEP 2 loss=0.3333" in streamed and "[worker:1] done" in streamed
    assert not any("RESULT" in ln for ln in streamed)
    assert any(ln.startswith("RESULT {") for ln in rt.get_run("worker:1").lines())

    results = rt.results()
    assert results == {"worker:0": {"index": 0, "losses": [1.0, 0.5, 0.3333]},
                       "worker:1": {"index": 1, "losses": [1.0, 0.5, 0.3333]}}
    assert str(results).splitlines()[2].split() == ["worker:0", "0", "1", "->", "0.3333", "(3)"]
    assert [r["loss"] for r in rt.get_run("worker:0").records("STEP")] == [1.0, 0.5, 0.3333]

    capsys.readouterr()
    ip.run_line_magic("workerlog", '1 --grep "^STEP [12]" -n 1')
    assert capsys.readouterr().out == "[worker:1] STEP 2 loss=0.3333\n"
    with pytest.raises(UsageError, match="not a regular expression"):
        rt.log("worker:1", grep="(")
