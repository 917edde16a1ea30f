"""The nightly's publish and notify jobs, run from the committed workflow's own scripts over three
nights against a local "GitHub Pages" (http.server on 127.0.0.1) and a fake issues API: the
records and the last table come back from the published site (verified), the diff lands in the
job summary, history/ keeps earlier signed tables, a forged site stops the run, and notify turns
a regression red."""

import base64
import functools
import http.server
import json
import os
import shutil
import subprocess
import tarfile
import threading
import time
from pathlib import Path

import pytest
import yaml
from table_fixtures import combo, image, passed, rec, verdict, write_all
from test_notify import REPO, TOKEN, FakeGitHub

from envbuild.workflow import WORKFLOW_FILE
from envbuild.sign import load_public_key, verify_envelope, write_keypair

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / WORKFLOW_FILE
A = combo(verl="0.4.1", ev="0.8.4")
B = combo(verl="0.5.0", ev="0.8.5")
# Three recent nights (tables expire: `generated` must be recent for the new table to verify).
NIGHTS = [int(time.time()) - 3 * 86400 + i * 86400 for i in range(4)]


def stamp(epoch):
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(epoch))

pytestmark = pytest.mark.skipif(not shutil.which("curl"), reason="the scripts fetch with curl")


def _record_key(where: Path) -> tuple[str, str]:
    """The record key (ENVBUILD_RECORD_KEY, ENVBUILD_RECORD_PUBKEY): another key than the table's."""
    if not (where / "record-keys" / "record.key").exists():
        write_keypair(where / "record-keys", "record")
    return ((where / "record-keys" / "record.key").read_text(),
            (where / "record-keys" / "record.pub.json").read_text())


def _steps(job, workflow=WORKFLOW):
    wf = yaml.safe_load(Path(workflow).read_text())
    return {s["id"]: s for s in wf["jobs"][job]["steps"] if "id" in s}


class Pages:
    """A static site server whose folder can be swapped between nights."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        handler = functools.partial(self._Handler, directory=str(root))
        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    class _Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a):
            pass

    def serve(self, site: Path):
        shutil.rmtree(self.root)
        shutil.copytree(site, self.root)


def night(work: Path, pages: Pages, key_pem: str, records, epoch: int, keep: int = 60, expect_fail=None,
          workflow=WORKFLOW, env_more=None, unsigned=()):
    """One publish job of `workflow` in `work` (fresh), tonight's records in place of the artifact
    download: each combination's build job signs its own (the build job's sign step, on a runner
    of its own), then they merge into results/; `unsigned` ones are added to the artifacts after."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    (work / "rt").mkdir()
    out, summary = work / "github_output", work / "summary.md"
    env = {**os.environ, "TABLE_URL": pages.url, "RUNNER_TEMP": str(work / "rt"), "GITHUB_OUTPUT": str(out),
           "GITHUB_STEP_SUMMARY": str(summary), "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1",
           "SOURCE_DATE_EPOCH": str(epoch), "ENVBUILD_STATE": str(work.parent / "state"),
           "GITHUB_RUN_ID": str(epoch), **(env_more or {})}
    record_pem, record_pub = _record_key(work.parent)
    steps = _steps("publish", workflow)

    def run(step_id, **more):
        p = subprocess.run(["bash", "-c", steps[step_id]["run"]], cwd=work, env={**env, **more},
                           capture_output=True, text=True, timeout=300)
        return p

    p = run("earlier", ENVBUILD_SIGNING_KEY=key_pem, ENVBUILD_PUBKEY="")
    if expect_fail == "earlier":
        return p, work
    assert p.returncode == 0, p.stderr
    sign_step = _steps("build", workflow)["sign-records"]
    for cid in sorted({r.combo["id"] for r in records}):
        job = work / "jobs" / cid
        write_all(job / "results", [r for r in records if r.combo["id"] == cid])
        p = subprocess.run(["bash", "-c", sign_step["run"]], cwd=job, capture_output=True, text=True, timeout=120,
                           env={**env, "ENVBUILD_RECORD_KEY": record_pem, "JOB": f"build-{cid}", "ID": cid,
                                "RESULTS": "results"})
        assert p.returncode == 0, p.stderr
        # "Tonight's results" (download-artifact, merge-multiple)
        shutil.copytree(job / "results", work / "results", dirs_exist_ok=True)
    write_all(work / "results", list(unsigned))
    p = run("sign", ENVBUILD_SIGNING_KEY=key_pem, ENVBUILD_RECORD_PUBKEY=record_pub)
    assert p.returncode == 0, p.stderr
    p = run("last", ENVBUILD_PUBKEY="")
    assert p.returncode == 0, p.stderr
    found = dict(line.split("=", 1) for line in out.read_text().splitlines())["found"]
    for sid in ("diff", "site"):
        p = run(sid, FOUND=found, HISTORY_KEEP=str(keep))
        if sid == expect_fail:
            return p, work  # the job stops at a failed step: later steps do not run
        assert p.returncode == 0, (sid, p.stderr)
    return p, work


def test_three_nights_of_publishing(tmp_path, run_cli):
    priv, pub, _ = write_keypair(tmp_path / "keys")
    key_pem = Path(priv).read_text()
    pages = Pages(tmp_path / "pages")
    try:
        # Night 1: nothing published yet.
        _, w1 = night(tmp_path / "n1", pages, key_pem, [rec(A, passed("env", "contract"), img=image(A), run=1),
                                                        rec(B, passed("env", "contract"), img=image(B), run=2)],
                      epoch=NIGHTS[0])
        s1 = (w1 / "summary.md").read_text()
        assert "No published table yet" in s1 and "first run" in s1
        site1 = w1 / "site"
        assert {"index.html", "compat.json", "compat.json.dsse", "pubkey.json", "results.tar.gz",
                "history.tar.gz"} <= {p.name for p in site1.iterdir()}
        assert json.loads((site1 / "history" / "index.json").read_text()) == []
        pages.serve(site1)

        # Night 2 runs only A, which regressed: B's verdict comes back from the site's records.
        broken = rec(A, {"env": verdict("pass"), "contract": verdict("fail", "import-error", "No module named x")},
                     img=image(A, build=1), status="fail", run=11)
        p, w2 = night(tmp_path / "n2", pages, key_pem, [broken], epoch=NIGHTS[1])
        assert p.returncode == 0, p.stderr
        s2 = (w2 / "summary.md").read_text()
        assert "1 regression(s)" in s2 and A["id"] in s2 and "both signatures verified" in s2
        rows = {r["id"]: r for r in json.loads((w2 / "site" / "compat.json").read_text())["rows"]}
        assert rows[A["id"]]["status"] == "broken" and rows[B["id"]]["status"] == "verified"
        with tarfile.open(w2 / "site" / "results.tar.gz") as t:
            assert len([n for n in t.getnames() if n.endswith(".json")]) == 3
        hist = json.loads((w2 / "site" / "history" / "index.json").read_text())
        assert hist == [f"{stamp(NIGHTS[0])}.compat.json.dsse"]  # night 1's table, by its generated time
        # The history entry is night 1's signed table: its envelope verifies, its payload is that compat.json.
        env1 = json.loads((w2 / "site" / "history" / hist[0]).read_text())
        payload, _ = verify_envelope(env1, load_public_key(pub), hist[0])
        assert payload == (site1 / "compat.json").read_bytes()
        assert json.loads((w2 / "diff.json").read_text())["regressions"][0]["id"] == A["id"]

        # The notify job on night 2's outputs: A's issue opens and the nightly goes red.
        gh = FakeGitHub()
        try:
            env = {**os.environ, "ENVBUILD_STATE": str(tmp_path / "state-notify"), "GITHUB_API_URL": gh.url, "GITHUB_REPOSITORY": REPO, "TABLE_URL": pages.url}
            step = _steps("notify")["notify"]
            p = subprocess.run(["bash", "-c", step["run"]], cwd=w2, env={**env, "GITHUB_TOKEN": TOKEN},
                               capture_output=True, text=True, timeout=120)
            assert p.returncode == 1 and "regressed" in p.stderr, p.stdout + p.stderr
            assert [i["title"] for i in gh.issues.values()] == [f"envbuild: {A['id']} broken at contract (import-error)"]
        finally:
            gh.close()
        pages.serve(w2 / "site")

        # Night 3 keeps one earlier table: night 2's (night 1's is pruned).
        _, w3 = night(tmp_path / "n3", pages, key_pem, [rec(A, passed("env", "contract"), img=image(A, build=2), run=21)],
                      epoch=NIGHTS[2], keep=1)
        assert json.loads((w3 / "site" / "history" / "index.json").read_text()) == [f"{stamp(NIGHTS[1])}.compat.json.dsse"]
        assert "0 regression" in (w3 / "summary.md").read_text() or "no regressions" in (w3 / "summary.md").read_text()

        # A forged published table (a row flipped to verified) stops the run before any diff or site.
        forged = tmp_path / "forged"
        shutil.copytree(w3 / "site", forged)
        env = json.loads((forged / "compat.json.dsse").read_text())
        doc = json.loads(base64.b64decode(env["payload"]))
        doc["rows"][0]["status"] = "broken" if doc["rows"][0]["status"] != "broken" else "verified"
        forged_bytes = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
        env["payload"] = base64.b64encode(forged_bytes).decode()  # the old signature kept
        (forged / "compat.json.dsse").write_text(json.dumps(env))
        (forged / "compat.json").write_bytes(forged_bytes)
        pages.serve(forged)
        p, w4 = night(tmp_path / "n4", pages, key_pem, [], epoch=NIGHTS[3], expect_fail="earlier")
        assert p.returncode == 2 and "signature" in p.stderr and not (w4 / "site").exists(), p.stderr
        assert not list((w4 / "results").rglob("*.json"))  # nothing of the forged site was taken
    finally:
        pages.srv.shutdown()
        pages.srv.server_close()


def test_a_team_repository_runs_its_generated_nightly(tmp_path, run_cli):
    """Issue 28, proof outside a fork: `envbuild ci github` in a repository that holds a matrix and
    nothing else; then the generated workflow's own `run:` steps, in job order, with GitHub's
    variables set: envbuild installed by the install step from a spec (the checkout here, as a
    team's vars.ENVBUILD_INSTALL names a commit) into a fresh venv that every later step uses; the
    plan job's repository default; the publish job onto a local Pages (sign, last, diff, site), twice;
    notify against the fake issues API. The published site verifies with the team's key."""
    import venv

    repo = tmp_path / "team"
    (repo / "matrix").mkdir(parents=True)
    shutil.copy(ROOT / "matrix" / "verl.yaml", repo / "matrix" / "verl.yaml")
    # generated pinned to a commit (the default spec); the run below overrides it as vars.ENVBUILD_INSTALL would
    pinned = "git+https://example.invalid/envbuild.git@" + "ab" * 20
    p = run_cli("ci", "github", "--gpu-runners", "none", "--install", pinned, cwd=repo)
    assert p.returncode == 0, p.stderr
    wf_path = repo / ".github" / "workflows" / "envbuild-nightly.yml"
    wf = yaml.safe_load(wf_path.read_text())
    scripts = "\n".join(s.get("run", "") for j in wf["jobs"].values() for s in j.get("steps", []))
    assert "pip install ." not in scripts and "probe" not in wf["jobs"]

    # The install step, as the runner runs it: `python` is the job's interpreter (a fresh venv).
    py_env = tmp_path / "runner-python"
    venv.create(py_env, with_pip=True)
    bindir = py_env / "bin"
    gh_env = {"PATH": f"{bindir}:{os.environ['PATH']}", "VIRTUAL_ENV": str(py_env),
              "GITHUB_REPOSITORY": "Team-Org/rl-stack", "GITHUB_REPOSITORY_OWNER": "Team-Org",
              "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    install = next(s for s in wf["jobs"]["plan"]["steps"] if s.get("name") == "Install envbuild")
    q = subprocess.run(["bash", "-c", install["run"]], cwd=repo, capture_output=True, text=True, timeout=600,
                       env={**os.environ, **gh_env, "ENVBUILD_INSTALL": f"{ROOT}[all]"})
    assert q.returncode == 0, q.stderr[-2000:]
    assert (bindir / "envbuild").exists()

    # plan: the repository default when vars.ENVBUILD_REPOSITORY is unset (lower case: GHCR's rule)
    (tmp_path / "plan").mkdir()
    out = tmp_path / "plan" / "github_output"
    step = next(s for s in wf["jobs"]["plan"]["steps"] if s.get("id") == "repository")
    q = subprocess.run(["bash", "-c", step["run"]], cwd=repo, capture_output=True, text=True, timeout=60,
                       env={**os.environ, **gh_env, "ENVBUILD_REPOSITORY": "", "GITHUB_OUTPUT": str(out),
                            "GITHUB_STEP_SUMMARY": str(tmp_path / "plan" / "summary.md")})
    assert q.returncode == 0 and out.read_text() == "repository=ghcr.io/team-org/rl-stack\n", q.stderr

    # publish, two nights, with the team's own key; the runner's envbuild does the work
    keys = tmp_path / "team-keys"
    priv, pub, _ = write_keypair(keys)
    key_pem = Path(priv).read_text()
    pages = Pages(tmp_path / "pages")
    try:
        run_env = {"PATH": gh_env["PATH"], "VIRTUAL_ENV": str(py_env)}
        _, w1 = night(tmp_path / "n1", pages, key_pem, [rec(A, passed("env", "contract"), img=image(A), run=1)],
                      epoch=NIGHTS[1], workflow=wf_path, env_more=run_env)
        pages.serve(w1 / "site")
        broken = rec(A, {"env": verdict("pass"), "contract": verdict("fail", "import-error", "No module named x")},
                     img=image(A, build=1), status="fail", run=11)
        p, w2 = night(tmp_path / "n2", pages, key_pem, [broken], epoch=NIGHTS[2], workflow=wf_path, env_more=run_env)
        assert "1 regression(s)" in (w2 / "summary.md").read_text()
        env2 = json.loads((w2 / "site" / "compat.json.dsse").read_text())
        payload, _ = verify_envelope(env2, load_public_key(pub), "compat.json.dsse")
        assert payload == (w2 / "site" / "compat.json").read_bytes()
        assert {r["id"]: r["status"] for r in json.loads(payload)["rows"]} == {A["id"]: "broken"}

        gh = FakeGitHub()
        try:
            step = _steps("notify", wf_path)["notify"]
            q = subprocess.run(["bash", "-c", step["run"]], cwd=w2, capture_output=True, text=True, timeout=120,
                               env={**os.environ, **run_env, "ENVBUILD_STATE": str(tmp_path / "state-notify"),
                                    "GITHUB_API_URL": gh.url, "GITHUB_REPOSITORY": REPO, "TABLE_URL": pages.url,
                                    "GITHUB_TOKEN": TOKEN})
            assert q.returncode == 1 and "regressed" in q.stderr, q.stdout + q.stderr
            assert [i["title"] for i in gh.issues.values()] == [f"envbuild: {A['id']} broken at contract (import-error)"]
        finally:
            gh.close()
    finally:
        pages.srv.shutdown()
        pages.srv.server_close()


def test_an_unsigned_record_in_tonights_artifacts_becomes_no_row(tmp_path):
    """Issue 49, item 3, against the workflow's own steps: a record added to the artifacts after the
    jobs signed theirs (a row nobody built, and one outranking tonight's honest failure with a later
    run id) is not folded, not carried to the next night, and the summary says so."""
    priv, _, _ = write_keypair(tmp_path / "keys")
    key_pem = Path(priv).read_text()
    pages = Pages(tmp_path / "pages")
    try:
        honest = rec(A, {"env": verdict("pass"), "contract": verdict("fail", "import-error", "No module named x")},
                     img=image(A), status="fail", run=5)
        forged_a = rec(A, passed("env", "contract", "gpu"), img=image(A), run=9)
        invented = rec(B, passed("env", "contract", "gpu"), img=image(B), run=9)
        _, w = night(tmp_path / "n1", pages, key_pem, [honest], epoch=NIGHTS[3], unsigned=[forged_a, invented])
        rows = {r["id"]: r for r in json.loads((w / "site" / "compat.json").read_text())["rows"]}
        assert set(rows) == {A["id"]} and rows[A["id"]]["status"] == "broken"
        with tarfile.open(w / "site" / "results.tar.gz") as t:
            assert [n for n in t.getnames()] == [f"records/{A['id']}/{honest.run_id}.json"]
        assert "**2 record(s) or signature(s) not folded**" in (w / "summary.md").read_text()
    finally:
        pages.srv.shutdown()
        pages.srv.server_close()
