"""The first hour (issue 28): a mistyped command or flag gets a "did you mean", an error under
--json is JSON on stdout, and each is one line on stderr with exit 2."""

import json


def test_mistyped_command_and_flag(run_cli):
    p = run_cli("plna")
    assert p.returncode == 2 and "unknown command 'plna' (did you mean 'plan'?)" in p.stderr
    q = run_cli("plan", "--verll", "0.4.1")
    assert q.returncode == 2 and q.stderr.splitlines()[0] == "envbuild plan: unknown flag '--verll' (did you mean --verl?)"
    assert "usage: envbuild plan" in q.stderr  # the command's usage, not the top level's
    r = run_cli("doctor", "--skip", "env", "--", "trainer.nnodes=1", "--verll")  # after --: overrides, not flags
    assert "unknown flag" not in r.stderr


def test_an_error_under_json_is_json(run_cli):
    p = run_cli("lock", "--json", "--vllm", "9.9", "--out", "/nonexistent-envbuild")
    assert p.returncode == 2
    err = json.loads(p.stdout)["error"]
    assert err["command"] == "lock" and err["exit_code"] == 2 and "--vllm='9.9'" in err["message"]


def test_an_unwritable_output_is_one_line_naming_the_path(run_cli, tmp_path):
    """Issue 27: unwritable output paths raised tracebacks (exit 1, the code of a verdict)."""
    f = tmp_path / "a-file"
    f.write_text("")
    bad = f / "sub"  # a file where a folder belongs
    for args in (["keygen", "--out", bad], ["ci", "github", "--out", bad],
                 ["render", "--verl", "0.4.1", "--hf", "--cuda", "cu124", "--out", bad],
                 ["discover", "--write", bad / "p.yaml"]):
        p = run_cli(*args)
        assert p.returncode == 2 and "Traceback" not in p.stderr, (args, p.stderr[-500:])
        assert str(bad) in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
