"""`envbuild ci notify` against a local fake of GitHub's REST issue endpoints (127.0.0.1):
newly broken rows open issues, reruns do not duplicate them, fixed rows close them, a row that
breaks again reopens its own issue, and a regression of a verified row fails the run."""

import json
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from table_fixtures import combo, image, passed, rec, verdict, write_all

from envbuild.sign import write_keypair
from envbuild.table import publish

REPO = "acme/stacks"
TOKEN = "test-token"

A = combo(verl="0.4.1", ev="0.8.4")    # verified, then regresses at contract, then is fixed
B = combo(verl="0.5.0", ev="0.8.5")    # verified throughout
C = combo(verl="0.4.1", ev="0.8.5")    # broken before the first table: known, not news
U = combo(verl="0.5.0", engine="sglang", ev="0.4.6")  # new row, its lock is unsatisfiable
TRACE = "Traceback (most recent call last):\n  File \"verl/workers/rollout.py\", line 3\n" \
        "ModuleNotFoundError: No module named 'vllm.worker.worker_base'"


class FakeGitHub:
    """The issue endpoints notify uses, with GitHub's shapes: list (labels/state filters,
    Link pagination of 2 per page), create, update, comment. Records every call."""

    def __init__(self, login: str | None = "envbuild-bot"):
        self.login = login  # what GET /user answers (None: refused, as for a GITHUB_TOKEN)
        self.issues: dict[int, dict] = {}
        self.comments: dict[int, list[str]] = {}
        self.calls: list[tuple[str, str]] = []
        handler = self._handler()
        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def _handler(fake):
        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, body, headers=None):
                raw = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def _route(self, method):
                u = urllib.parse.urlsplit(self.path)
                fake.calls.append((method, u.path))
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    return self._send(401, {"message": "Bad credentials"})
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")
                base = f"/repos/{REPO}/issues"
                if method == "GET" and u.path == "/user":
                    return self._send(200, {"login": fake.login}) if fake.login else self._send(
                        403, {"message": "Resource not accessible by integration"})
                if method == "GET" and u.path == base:
                    q = dict(urllib.parse.parse_qsl(u.query))
                    items = [i for i in sorted(fake.issues.values(), key=lambda i: i["number"])
                             if (q.get("state", "open") == "all" or i["state"] == q.get("state", "open"))
                             and (not q.get("labels") or q["labels"] in [x["name"] for x in i["labels"]])]
                    page, per = int(q.get("page", 1)), 2
                    headers = {}
                    if len(items) > page * per:
                        nq = urllib.parse.urlencode({**q, "page": page + 1})
                        headers["Link"] = f'<{fake.url}{base}?{nq}>; rel="next"'
                    return self._send(200, items[(page - 1) * per:page * per], headers)
                if method == "POST" and u.path == base:
                    n = max(fake.issues, default=0) + 1
                    fake.issues[n] = {"number": n, "title": body["title"], "body": body["body"], "state": "open",
                                      "labels": [{"name": x} for x in body.get("labels", [])],
                                      "user": {"login": fake.login or "github-actions[bot]"}}
                    return self._send(201, fake.issues[n])
                m = re.fullmatch(rf"{base}/(\d+)(/comments)?", u.path)
                if m and int(m.group(1)) in fake.issues:
                    n = int(m.group(1))
                    if method == "PATCH" and not m.group(2):
                        fake.issues[n].update({k: v for k, v in body.items() if k in ("title", "body", "state")})
                        return self._send(200, fake.issues[n])
                    if method == "POST" and m.group(2):
                        fake.comments.setdefault(n, []).append(body["body"])
                        return self._send(201, {"body": body["body"]})
                return self._send(404, {"message": "Not Found"})

            def do_GET(self):
                self._route("GET")

            def do_POST(self):
                self._route("POST")

            def do_PATCH(self):
                self._route("PATCH")

        return H

    def by_combo(self, cid):
        found = [i for i in self.issues.values() if f"envbuild:combination={cid} " in i["body"]]
        assert len(found) <= 1, f"two issues for {cid}"
        return found[0] if found else None

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture
def gh():
    f = FakeGitHub()
    # Someone else's issue (no marker) and a pull request: notify must leave both alone.
    f.issues[1] = {"number": 1, "title": "unrelated", "body": "hello", "state": "open",
                   "labels": [{"name": "envbuild"}]}
    f.issues[2] = {"number": 2, "title": "a PR", "body": "x", "state": "open", "pull_request": {},
                   "labels": [{"name": "envbuild"}]}
    yield f
    f.close()


def table(tmp_path, name, key, records):
    res = tmp_path / f"results-{name}"
    write_all(res, records)
    publish(res, key, tmp_path / name)
    return tmp_path / name


def test_notify_opens_updates_and_closes(tmp_path, gh, run_cli, monkeypatch):
    priv, pub, _ = write_keypair(tmp_path / "keys")
    env = {"GITHUB_API_URL": gh.url, "GITHUB_REPOSITORY": REPO, "GITHUB_TOKEN": TOKEN,
           "GITHUB_SERVER_URL": "https://github.example", "GITHUB_RUN_ID": "77"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("ENVBUILD_STATE", str(tmp_path / "state"))  # the reader's trust state: this test's own

    def notify(old, new):
        p = run_cli("ci", "notify", new, "--old", old, "--pubkey", pub, "--table-url", "https://t.example/")
        print(p.stdout, p.stderr)
        return p

    broken_c = rec(C, {"env": verdict("fail", "pip-check", "vllm 0.8.5 requires torch==2.6.0")}, img=image(C),
                   status="fail", run=3)
    night1 = table(tmp_path, "n1", priv, [rec(A, passed("env", "contract"), img=image(A), run=1),
                                          rec(B, passed("env", "contract"), img=image(B), run=2), broken_c])
    # Night 2: A regresses at contract; U appears and cannot be locked.
    a_broken = rec(A, {"env": verdict("pass"), "contract": verdict("fail", "import-error", TRACE)},
                   img=image(A, build=1), status="fail", run=11)
    u_unsat = rec(U, stage="lock", status="fail", cause="unsatisfiable",
                  detail="Because sglang==0.4.6 depends on torch==2.5.1 and verl==0.5.0 depends on torch>=2.6 ...", run=12)
    night2 = table(tmp_path, "n2", priv, [rec(A, passed("env", "contract"), img=image(A), run=1), a_broken,
                                          rec(B, passed("env", "contract"), img=image(B), run=2), broken_c, u_unsat])

    p = notify(night1, night2)
    assert p.returncode == 1, p.stderr  # A was verified and regressed: the job fails
    assert A["id"] in p.stderr and "regressed" in p.stderr
    ia, iu = gh.by_combo(A["id"]), gh.by_combo(U["id"])
    assert ia["state"] == "open" and ia["title"] == f"envbuild: {A['id']} broken at contract (import-error)"
    assert "No module named 'vllm.worker.worker_base'" in ia["body"] and "```" in ia["body"]
    assert "https://github.example/acme/stacks/actions/runs/77" in ia["body"]
    assert iu["title"] == f"envbuild: {U['id']} is unsatisfiable" and "depends on torch==2.5.1" in iu["body"]
    assert gh.by_combo(C["id"]) is None and gh.by_combo(B["id"]) is None  # known-broken, fine: no issue
    assert f"#{ia['number']} opened: {A['id']}" in p.stdout and f"#{iu['number']} opened: {U['id']}" in p.stdout
    assert gh.issues[1]["state"] == "open" and gh.issues[1]["body"] == "hello"  # not ours: untouched

    # A rerun of the same night changes nothing (no duplicate issues, no comments). Its issues
    # are on the second page of the listing (oldest first, 2 per page): found through Link.
    n_issues, n_calls, n_gets = len(gh.issues), len([c for c in gh.calls if c[0] != "GET"]), len(gh.calls)
    p = notify(night1, night2)
    assert [c for c in gh.calls[n_gets:] if c[0] == "GET"] == [("GET", "/user")] + [("GET", f"/repos/{REPO}/issues")] * 2
    assert p.returncode == 1 and len(gh.issues) == n_issues
    assert len([c for c in gh.calls if c[0] != "GET"]) == n_calls and "no issue to open" in p.stdout

    # Night 3: A is fixed (a new image passes); U now fails to build for another reason.
    a_fixed = rec(A, passed("env", "contract"), img=image(A, build=2), run=21)
    u_build = rec(U, stage="build", status="fail", cause="compile-error", detail="error: flash_attn build failed", run=22)
    night3 = table(tmp_path, "n3", priv, [rec(A, passed("env", "contract"), img=image(A), run=1), a_broken, a_fixed,
                                          rec(B, passed("env", "contract"), img=image(B), run=2), broken_c,
                                          u_unsat, u_build])
    p = notify(night2, night3)
    assert p.returncode == 0, p.stderr
    assert gh.issues[ia["number"]]["state"] == "closed"
    assert any("Fixed" in c for c in gh.comments[ia["number"]])
    iu = gh.issues[iu["number"]]
    assert iu["state"] == "open" and iu["title"] == f"envbuild: {U['id']} broken at build (compile-error)"
    assert any("was: " in c and "unsatisfiable" in c for c in gh.comments[iu["number"]])
    assert f"closed: {A['id']}" in p.stdout and f"updated: {U['id']}" in p.stdout

    # Night 4: A breaks again: its own issue reopens (one issue per combination, ever).
    a_again = rec(A, {"env": verdict("fail", "pip-check", "broken requirement")}, img=image(A, build=3),
                  status="fail", run=31)
    night4 = table(tmp_path, "n4", priv, [a_again, rec(B, passed("env", "contract"), img=image(B), run=2),
                                          broken_c, u_unsat, u_build])
    p = notify(night3, night4)
    assert p.returncode == 1
    again = gh.by_combo(A["id"])
    assert again["number"] == ia["number"] and again["state"] == "open" and "pip-check" in again["title"]
    assert f"reopened: {A['id']}" in p.stdout


def test_notify_refuses_a_tampered_table_and_missing_credentials(tmp_path, gh, run_cli, monkeypatch):
    monkeypatch.setenv("ENVBUILD_STATE", str(tmp_path / "state"))
    priv, pub, _ = write_keypair(tmp_path / "keys")
    t = table(tmp_path, "t", priv, [rec(A, {"env": verdict("fail", "pip-check")}, img=image(A), status="fail", run=1)])
    monkeypatch.delenv("GITHUB_TOKEN", raising=False)
    p = run_cli("ci", "notify", t, "--pubkey", pub)
    assert p.returncode == 2 and "GITHUB_TOKEN" in p.stderr
    monkeypatch.setenv("GITHUB_API_URL", gh.url)
    monkeypatch.setenv("GITHUB_REPOSITORY", REPO)
    monkeypatch.setenv("GITHUB_TOKEN", "wrong")
    p = run_cli("ci", "notify", t, "--pubkey", pub)
    assert p.returncode == 3 and "HTTP 401" in p.stderr  # the API refused: infrastructure
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    doc = json.loads((t / "compat.json").read_text())
    doc["rows"][0]["status"] = "verified"
    (t / "compat.json").write_text(json.dumps(doc))
    p = run_cli("ci", "notify", t, "--pubkey", pub)
    assert p.returncode != 0 and not [c for c in gh.calls if c[0] != "GET"]


def test_a_night_s_first_table_does_not_close_a_gpu_failure_it_has_not_judged(tmp_path, gh, run_cli, monkeypatch):
    # The nightly publishes twice: first without the gpu verdicts (notify), then with them
    # (notify-gpu). A row broken at gpu whose image changed is verified up to contract in the first
    # table: that is not its fix, and closing then reopening its issue every night is noise.
    priv, pub, _ = write_keypair(tmp_path / "keys")
    for k, v in {"GITHUB_API_URL": gh.url, "GITHUB_REPOSITORY": REPO, "GITHUB_TOKEN": TOKEN}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("ENVBUILD_STATE", str(tmp_path / "state"))

    def notify(old, new):
        return run_cli("ci", "notify", new, "--old", old, "--pubkey", pub)

    gpu_fail = {**passed("env", "contract"), "gpu": verdict("fail", "logprob-mismatch", "|engine - trainer| 0.9")}
    ok = rec(A, passed("env", "contract", "gpu"), img=image(A), run=1)
    broke = rec(A, gpu_fail, img=image(A, build=1), status="fail", run=2)
    cpu_new = rec(A, passed("env", "contract"), img=image(A, build=2), run=3)  # a new image, no gpu verdict yet
    g0 = table(tmp_path, "g0", priv, [ok])
    g1 = table(tmp_path, "g1", priv, [ok, broke])
    assert notify(g0, g1).returncode == 1
    issue = gh.by_combo(A["id"])
    assert issue["state"] == "open" and "gpu" in issue["title"]

    first = table(tmp_path, "n2-first", priv, [ok, broke, cpu_new])
    p = notify(g1, first)
    assert p.returncode == 0, p.stderr
    assert gh.issues[issue["number"]]["state"] == "open" and not gh.comments.get(issue["number"]), p.stdout
    # Its table one night later still has no gpu verdict (the gpu job did not run): still open.
    later = table(tmp_path, "n3-first", priv, [ok, broke, cpu_new, rec(A, passed("env", "contract"), img=image(A, build=2), run=4)])
    assert notify(first, later).returncode == 0 and gh.issues[issue["number"]]["state"] == "open"

    # The gpu publish: the new image fails at gpu too -> the same issue, never closed in between.
    gpu_again = rec(A, gpu_fail, img=image(A, build=2), status="fail", run=5)
    with_gpu = table(tmp_path, "n3-gpu", priv, [ok, broke, cpu_new, gpu_again])
    notify(later, with_gpu)
    assert gh.issues[issue["number"]]["state"] == "open"
    assert not any("reopened" in c or "Broken again" in c for c in gh.comments.get(issue["number"], []))
    # ... and when its gpu level passes, the issue closes.
    fixed = table(tmp_path, "n4-gpu", priv, [ok, broke, cpu_new, gpu_again,
                                             rec(A, passed("env", "contract", "gpu"), img=image(A, build=3), run=6)])
    p = notify(with_gpu, fixed)
    assert p.returncode == 0 and gh.issues[issue["number"]]["state"] == "closed", p.stdout + p.stderr
    assert any("Fixed" in c and "up to gpu" in c for c in gh.comments[issue["number"]])


def test_notify_touches_only_its_own_issues_and_keeps_its_deadline(tmp_path, gh, run_cli, monkeypatch):
    """Issue 49, item 6: an issue someone else opened with envbuild's marker in its body is never
    edited or closed; a server that rate-limits is waited for once within bounds; the whole run
    has a deadline."""
    import time as _time
    from envbuild.errors import InfraError
    from envbuild.github_api import GitHub
    from envbuild.notify import notify as notify_fn
    from envbuild.row import Table

    monkeypatch.setenv("ENVBUILD_STATE", str(tmp_path / "state"))
    priv, pub, _ = write_keypair(tmp_path / "keys")
    night = table(tmp_path, "n", priv, [rec(A, {"env": verdict("fail", "pip-check")}, img=image(A), status="fail", run=1)])
    from envbuild.trust import load_verified
    new = load_verified(night, pub, quiet=True)[0]
    marker = f"<!-- envbuild:combination={A['id']} -->"
    gh.issues[7] = {"number": 7, "title": "envbuild: planted", "body": f"mine now {marker}", "state": "closed",
                    "labels": [{"name": "envbuild"}], "user": {"login": "mallory"}}
    client = GitHub(gh.url, REPO, TOKEN)
    acts = notify_fn(client, Table(rows=[]), new, author="envbuild-bot")
    assert [a.kind for a in acts] == ["opened"] and gh.issues[7]["state"] == "closed" and 7 not in gh.comments
    assert gh.issues[acts[0].number]["user"]["login"] == "envbuild-bot"
    # the deadline: nothing is asked once it has passed
    late = GitHub(gh.url, REPO, TOKEN, deadline_s=0.01)
    _time.sleep(0.05)
    with pytest.raises(InfraError, match="deadline of 0 s passed"):
        late.issues()


def test_a_rate_limited_answer_is_waited_for_within_bounds():
    from envbuild.errors import InfraError
    from envbuild.github_api import MAX_RETRY_WAIT_S, GitHub, _RateLimited

    slept = []
    g = GitHub("https://api.example", REPO, TOKEN, sleep=slept.append)
    answers = [_RateLimited("u", 2.0), ([], {})]

    def once(method, path, body=None):
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a
    g._call_once = once
    assert g._call("GET", "/issues") == ([], {}) and slept == [2.0]
    g._call_once = lambda *a, **k: (_ for _ in ()).throw(_RateLimited("u", MAX_RETRY_WAIT_S + 1))
    with pytest.raises(InfraError, match="rate-limited, Retry-After"):
        g._call("GET", "/issues")
    assert slept == [2.0]  # a wait beyond the bound is not waited
