"""`envbuild ci notify NEW --old OLD`: one GitHub issue per broken combination, kept in step with the table.

Both tables are verified first (as `envbuild diff` does). Then, per combination:
  newly broken     (not broken in OLD, broken in NEW; "unsatisfiable" when its lock has no
                   solution)   -> open an issue, or reopen/update the one it had before
  still broken     with a different failure -> update the issue and comment what changed
  fixed            (verified in NEW, and every level that failed has passed since: a row verified
                   up to contract does not fix a failure at gpu) -> close its open issue
  gone             (no row in NEW) -> close its open issue: the matrix no longer has it
An untested row (infrastructure, no verdict) leaves its issue as it is. Each issue carries a
hidden marker naming its combination, so a later run finds it again (open or closed) and a
combination never has two issues. Exit 1 when a row that was verified in OLD regressed (a
level that passed now fails, `envbuild diff`'s rule): that is what must turn the nightly red.

GitHub's REST API (GITHUB_API_URL, GITHUB_REPOSITORY, GITHUB_TOKEN: what Actions provides)
through urllib. The token goes to the API's own origin only: a `Link: rel="next"` or a redirect
to any other origin is refused, pages are bounded, and every response must have the shape the
API documents. Every value taken from a table row goes into an issue as plain text (escaped, or
in a code span it cannot leave). An unreachable, refusing or misbehaving API is infrastructure
(exit 3).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from .diff import compare
from .errors import InfraError, UsageError
from .query import unsettled
from .row import Row, Table

LABEL = "envbuild"
MARKER = "<!-- envbuild:combination={id} -->"
# One issue per row, and one per row and scope (`<id>@<scope>`: broken only for runs that opt in).
_MARKER_RE = re.compile(r"<!-- envbuild:combination=([A-Za-z0-9_.+-]+(?:@[A-Za-z0-9_.:,+-]+)?) -->")
EXCERPT_LINES = 40  # the tail of the failure detail: where the error is
API_VERSION = "2022-11-28"
MAX_PAGES = 50  # 5,000 issues at 100 a page: more is a server that never ends its Link chain
MAX_RESPONSE_BYTES = 16 << 20
DEADLINE_S = 600  # the whole run: a server that answers slowly cannot hold the nightly
MAX_RETRY_WAIT_S = 60  # the longest Retry-After notify honours (GitHub's secondary rate limit)
MAX_RETRIES = 3
ACTIONS_BOT = "github-actions[bot]"  # who GITHUB_TOKEN's issues are by (its /user is refused)


# ---------------------------------------------------------------- the GitHub REST API


def _origin(url: str) -> tuple[str, str, int | None]:
    u = urllib.parse.urlsplit(url)
    return u.scheme.lower(), (u.hostname or "").lower(), u.port or {"https": 443, "http": 80}.get(u.scheme.lower())


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """urllib keeps the Authorization header on a redirect, whatever its target: none is followed."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise InfraError("github-api", f"{req.get_method()} {req.full_url}: HTTP {code} redirect to {newurl}: "
                         "not followed (the token goes to the API's own origin only)")


class GitHub:
    """The few issue endpoints notify needs (docs.github.com/rest/issues)."""

    def __init__(self, api: str, repo: str, token: str, timeout: float = 30, deadline_s: float = DEADLINE_S,
                 sleep=time.sleep):
        self.api, self.repo, self.token, self.timeout = api.rstrip("/"), repo, token, timeout
        self.origin = _origin(self.api)
        self._opener = urllib.request.build_opener(_NoRedirect())
        self.deadline_s, self._end = deadline_s, time.monotonic() + deadline_s
        self._sleep = sleep

    def identity(self) -> str | None:
        """The login the token acts as (GET /user); None where the API refuses to say (a
        GITHUB_TOKEN in Actions)."""
        try:
            me, _ = self._call("GET", f"{self.api}/user")
        except _HTTPStatus as e:
            if e.code in (403, 404):
                return None
            raise
        login = me.get("login") if isinstance(me, dict) else None
        return login if isinstance(login, str) and login else None

    def _url(self, path: str) -> str:
        if not path.startswith(("http://", "https://")):
            return f"{self.api}/repos/{self.repo}{path}"
        if _origin(path) != self.origin:
            raise InfraError("github-api", f"{path}: not the API's origin ({self.api}); the token is not sent there")
        return path

    def _call(self, method: str, path: str, body: dict | None = None) -> tuple[object, dict]:
        """One request within the run's deadline; a rate-limited answer (429, or 403 with
        Retry-After) is retried after the wait it asks for, bounded by MAX_RETRY_WAIT_S and the
        deadline."""
        for attempt in range(MAX_RETRIES + 1):
            try:
                return self._call_once(method, path, body)
            except _RateLimited as e:
                left = self._end - time.monotonic()
                if attempt == MAX_RETRIES or e.wait > MAX_RETRY_WAIT_S or e.wait >= left:
                    raise InfraError("github-api", f"{method} {e.url}: rate-limited, Retry-After {e.wait:.0f} s "
                                     f"(notify waits at most {MAX_RETRY_WAIT_S} s, {max(left, 0):.0f} s left of "
                                     f"its {self.deadline_s:.0f} s deadline)") from None
                self._sleep(e.wait)
        raise AssertionError("unreachable")

    def _call_once(self, method: str, path: str, body: dict | None = None) -> tuple[object, dict]:
        url = self._url(path)
        left = self._end - time.monotonic()
        if left <= 0:
            raise InfraError("github-api", f"{method} {url}: notify's deadline of {self.deadline_s:.0f} s passed")
        req = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Accept": "application/vnd.github+json",
                                              "Authorization": f"Bearer {self.token}",
                                              "X-GitHub-Api-Version": API_VERSION,
                                              "Content-Type": "application/json",
                                              "User-Agent": "envbuild-notify"})
        try:
            with self._opener.open(req, timeout=min(self.timeout, left)) as r:
                raw = r.read(MAX_RESPONSE_BYTES + 1)
                if len(raw) > MAX_RESPONSE_BYTES:
                    raise InfraError("github-api", f"{method} {url}: a response over {MAX_RESPONSE_BYTES} bytes")
                return (json.loads(raw) if raw else None), dict(r.headers)
        except urllib.error.HTTPError as e:
            wait = _retry_after(e)
            if wait is not None:
                raise _RateLimited(url, wait) from None
            msg = e.read(300).decode(errors="replace")
            raise _HTTPStatus(e.code, f"{method} {url}: HTTP {e.code} {msg}") from None
        except (urllib.error.URLError, OSError, ValueError, RecursionError) as e:
            # ValueError: bad JSON, and http.client's own (bad status line, headers) are OSErrors or ValueErrors
            raise InfraError("github-api", f"{method} {url}: {type(e).__name__}: {str(e)[:200]}") from None
        except Exception as e:  # http.client.HTTPException and kin: a server that does not speak HTTP
            raise InfraError("github-api", f"{method} {url}: {type(e).__name__}: {str(e)[:200]}") from None

    def issues(self) -> list[dict]:
        """Every issue with the envbuild label, open or closed (pull requests left out)."""
        out: list[dict] = []
        url: str | None = f"/issues?state=all&labels={LABEL}&per_page=100"
        seen: set[str] = set()
        for _ in range(MAX_PAGES):
            page, headers = self._call("GET", url)
            if not isinstance(page, list):
                raise InfraError("github-api", f"GET {url}: expected a list of issues, got {type(page).__name__}")
            for i in page:
                issue = _issue(i)
                if issue is not None:
                    out.append(issue)
            nxt = re.search(r'<([^>]+)>;\s*rel="next"', headers.get("Link") or headers.get("link") or "")
            if not nxt:
                return out
            url = nxt.group(1)
            if url in seen:
                raise InfraError("github-api", f"GET {url}: the Link chain loops")
            seen.add(url)
        raise InfraError("github-api", f"more than {MAX_PAGES} pages of issues: stopped")

    def create(self, title: str, body: str) -> dict:
        return _number(self._call("POST", "/issues", {"title": title, "body": body, "labels": [LABEL]})[0], "POST /issues")

    def update(self, number: int, **fields) -> dict:
        return _number(self._call("PATCH", f"/issues/{number}", fields)[0], f"PATCH /issues/{number}")

    def comment(self, number: int, body: str) -> None:
        self._call("POST", f"/issues/{number}/comments", {"body": body})


class _HTTPStatus(InfraError):
    """The API answered with an error status (infrastructure to the caller: exit 3)."""

    def __init__(self, code: int, message: str):
        super().__init__("github-api", message)
        self.code = code


class _RateLimited(Exception):
    def __init__(self, url: str, wait: float):
        super().__init__(url)
        self.url, self.wait = url, wait


def _retry_after(e: urllib.error.HTTPError) -> float | None:
    """Seconds a 429 / 403-with-Retry-After asks to wait (None: not a rate limit)."""
    if e.code not in (403, 429):
        return None
    raw = (e.headers or {}).get("Retry-After")
    if raw is None:
        return 60.0 if e.code == 429 else None
    try:
        return max(0.0, float(raw))
    except ValueError:
        return 60.0


def _issue(i: object) -> dict | None:
    """An issue as the API documents it, or None for anything else (a pull request, a stray shape)."""
    if not isinstance(i, dict) or "pull_request" in i:
        return None
    n, state = i.get("number"), i.get("state")
    if not isinstance(n, int) or isinstance(n, bool) or state not in ("open", "closed"):
        return None
    title, body, user = i.get("title"), i.get("body"), i.get("user")
    author = user.get("login") if isinstance(user, dict) else None
    return {"number": n, "state": state, "title": title if isinstance(title, str) else "",
            "body": body if isinstance(body, str) else "", "author": author if isinstance(author, str) else None}


def _number(d: object, what: str) -> dict:
    if not isinstance(d, dict) or not isinstance(d.get("number"), int) or isinstance(d.get("number"), bool):
        raise InfraError("github-api", f"{what}: the answer has no issue number")
    return d


# ---------------------------------------------------------------- plain text in Markdown


def plain(s: object) -> str:
    """Text that GitHub's Markdown shows as written: one line, every punctuation mark that could
    start markup escaped, mentions and references defused."""
    t = " ".join(str(s if s is not None else "").split())
    t = re.sub(r"([\\`*_{}\[\]()<>#+!|~=-])", r"\\\1", t)
    return t.replace("@", "@\u200b")  # no @mention, no team ping


def code(s: object) -> str:
    """An inline code span the text cannot leave: one line, a fence longer than any run of
    backticks in it, pipes escaped (GitHub splits table cells at them even inside code)."""
    t = " ".join(str(s if s is not None else "").split()).replace("|", "\\|")
    fence = "`" * (max((len(m) for m in re.findall(r"`+", t)), default=0) + 1)
    pad = " " if t.startswith("`") or t.endswith("`") or not t else ""
    return f"{fence}{pad}{t}{pad}{fence}"


def fenced(text: str) -> list[str]:
    """A fenced block whose fence no line of the text can close."""
    fence = "`" * max(3, max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    return [fence, text, fence]


def title_line(s: str) -> str:
    """An issue title: one line, no control characters, bounded."""
    return re.sub(r"[\x00-\x1f\x7f]+", " ", s)[:250]


# ---------------------------------------------------------------- what to say


def title_of(row: Row, scope: str = "") -> str:
    if scope:
        e = row.scopes.get(scope) or {}
        return title_line(f"envbuild: {row.id} broken with {e.get('label') or scope} ({scope})")
    f = row.failure
    if f and f.cause == "unsatisfiable":
        return title_line(f"envbuild: {row.id} is unsatisfiable")
    return title_line(f"envbuild: {row.id} broken at {(f.level if f else None) or '?'} ({(f.cause if f else None) or 'failed'})")


def body_of(row: Row, run_url: str | None, table_url: str | None, scope: str = "") -> str:
    if scope:
        return _scope_body(row, scope, run_url, table_url)
    f, c = row.failure, row.combo
    detail = "\n".join(str((f.detail if f else "") or "").rstrip().splitlines()[-EXCERPT_LINES:])
    eng = f"{c.engine or ''} {c.engine_version or ''}".strip()
    lines = [MARKER.format(id=row.id), "",
             f"The nightly found {code(row.id)} broken at {code((f.level if f else None) or '?')}: "
             f"{code((f.cause if f else None) or 'failed')}.", "",
             "| verl | engine | torch | CUDA | Python | platform |", "|---|---|---|---|---|---|",
             "| " + " | ".join(code(x) for x in (c.verl, eng, c.torch, c.cuda, c.python, c.platform or "linux/amd64"))
             + " |", ""]
    if row.pinned:
        lines += [f"Image: {code(row.pinned)}", ""]
    if detail:
        lines += ["Log excerpt:", ""] + fenced(detail) + [""]
    lines += [_footer(run_url, table_url, "the combination passes")]
    return "\n".join(lines) + "\n"


def _scope_body(row: Row, scope: str, run_url: str | None, table_url: str | None) -> str:
    e = row.scopes.get(scope) or {}
    detail = "\n".join(str(e.get("detail") or "").rstrip().splitlines()[-EXCERPT_LINES:])
    lines = [MARKER.format(id=f"{row.id}@{scope}"), "",
             f"The nightly found {code(row.id)} ({row.status}) broken for runs with "
             f"{plain(e.get('label') or scope)} ({code(scope)}, from {plain(e.get('from') or 'code')}); "
             "runs that do not use it are not affected.", ""]
    if detail:
        lines += ["Finding:", ""] + fenced(detail) + [""]
    lines += [_footer(run_url, table_url, "the scope passes")]
    return "\n".join(lines) + "\n"


def _footer(run_url: str | None, table_url: str | None, closes: str) -> str:
    links = [f"[run](<{_link(run_url)}>)"] if run_url else []
    if table_url:
        links.append(f"[table](<{_link(table_url)}>)")
    return (("See " + " · ".join(links) + ". " if links else "")
            + f"This issue is opened and closed by `envbuild ci notify`; it closes when {closes}.")


def _link(url: str) -> str:
    """A URL inside <...>: nothing that ends it or a line."""
    return re.sub(r"[\s<>]", "", url)


@dataclass
class Action:
    kind: str  # opened | reopened | updated | closed
    id: str
    number: int


def regressed(old: Table, new: Table) -> list[str]:
    """Rows verified in OLD with a level that passed there and fails now (`envbuild diff`'s rule)."""
    was = {r.id: r.status for r in old.rows}
    return sorted({c.id for c in compare(old, new).regressions if was.get(c.id) == "verified"})


def plan_actions(old: Table, new: Table) -> dict[str, str]:
    """{id: "broken" | "fixed" | "gone"} for rows whose issue may change. Fixed means every level
    that failed has passed since (query.unsettled): a row verified only below the failed level
    leaves its issue as it is, as an untested row does."""
    before = {r.id: r for r in old.rows}
    todo: dict[str, str] = {}
    for row in new.rows:
        if row.status == "broken":
            todo[row.id] = "broken"
        elif row.status in ("verified", "unpinned") and not unsettled(row, before.get(row.id)):
            todo[row.id] = "fixed"
    for cid in before.keys() - {r.id for r in new.rows}:
        todo[cid] = "gone"
    for row in new.rows:  # per scope: a run that opts in is broken, or works again
        for sc in row.scopes:
            todo[f"{row.id}@{sc}"] = "broken"
        old_row = before.get(row.id)
        for sc in (old_row.scopes if old_row else {}):
            if sc not in row.scopes and row.status != "broken":
                todo[f"{row.id}@{sc}"] = "fixed"
    for cid in before.keys() - {r.id for r in new.rows}:
        for sc in before[cid].scopes:
            todo[f"{cid}@{sc}"] = "gone"
    return todo


def notify(gh: GitHub, old: Table, new: Table, run_url: str | None = None, table_url: str | None = None,
           max_new: int = 30, author: str | None = None) -> list[Action]:
    """Open, update and close the issues of `new` against `old`. Only issues opened by `author`
    (the identity notify runs as) are its own: an issue someone else wrote with envbuild's marker
    in it is never edited, reopened or closed."""
    todo = plan_actions(old, new)
    rows_old = {r.id: r for r in old.rows}
    rows_new = {r.id: r for r in new.rows}
    mine: dict[str, dict] = {}
    for issue in sorted(gh.issues(), key=lambda i: i["number"]):
        if author is not None and issue.get("author") != author:
            continue
        m = _MARKER_RE.search(issue["body"])
        if m and (m.group(1) not in mine or issue["state"] == "open"):
            mine[m.group(1)] = issue  # an open one wins over an older closed one
    actions: list[Action] = []
    opened = 0
    for cid in sorted(todo):
        what, issue = todo[cid], mine.get(cid)
        is_open = bool(issue) and issue["state"] == "open"
        rid, _, scope = cid.partition("@")
        if what == "broken":
            row = rows_new[rid]
            title, body = title_of(row, scope), body_of(row, run_url, table_url, scope)
            before = rows_old.get(rid)
            newly = before is None or (scope not in before.scopes if scope else before.status != "broken")
            if issue is None:
                if not newly:
                    continue  # broken before and nobody kept an issue: not news tonight
                if opened >= max_new:
                    print(f"{cid}: newly broken; not opening more than {max_new} issues in one run", file=sys.stderr)
                    continue
                n = gh.create(title, body)["number"]
                opened += 1
                actions.append(Action("opened", cid, n))
            elif not is_open:
                if not newly:
                    continue  # someone closed it by hand while it stayed broken: respect that
                gh.update(issue["number"], state="open", title=title, body=body)
                gh.comment(issue["number"], f"Broken again: {plain(title.removeprefix('envbuild: '))}.")
                actions.append(Action("reopened", cid, issue["number"]))
            elif (issue["title"], issue["body"]) != (title, body):
                was = issue["title"]
                gh.update(issue["number"], title=title, body=body)
                if was != title:
                    gh.comment(issue["number"], f"Still broken, now: {plain(title.removeprefix('envbuild: '))} "
                                                f"(was: {plain(was.removeprefix('envbuild: '))}).")
                actions.append(Action("updated", cid, issue["number"]))
        elif is_open:
            row = rows_new.get(rid)
            if what == "fixed" and scope:
                why = f"Fixed: {code(rid)} is no longer broken with {code(scope)}"
            elif what == "fixed":
                why = f"Fixed: {code(cid)} is {row.status} in the new table" + (
                    f" (up to {row.best_level})" if row.best_level else "")
            else:
                why = f"{code(cid)} is no longer in the table (the matrix dropped it)"
            gh.comment(issue["number"], why + ". Closed by `envbuild ci notify`.")
            gh.update(issue["number"], state="closed", state_reason="completed" if what == "fixed" else "not_planned")
            actions.append(Action("closed", cid, issue["number"]))
    return actions


# ---------------------------------------------------------------- CLI (under `envbuild ci`)


def add_arguments(p) -> None:
    p.add_argument("new", help="tonight's table (directory, compat.json, its .dsse, or a URL)")
    p.add_argument("--old", help="the last published table (omitted: none yet, every broken row is new)")
    p.add_argument("--pubkey", help="public key JSON that signed both tables")
    p.add_argument("--insecure", action="store_true", help="skip signature checks (never in CI)")
    p.add_argument("--table-url", help="where the table is published (linked from the issues)")
    p.add_argument("--max-new", type=int, default=30, help="open at most this many new issues per run (default 30)")
    p.add_argument("--author", metavar="LOGIN",
                   help="the identity notify runs as: only its own issues are touched (default: the token's "
                        f"login, else {ACTIONS_BOT} inside GitHub Actions)")
    p.add_argument("--deadline", type=float, default=DEADLINE_S, metavar="S",
                   help=f"give up (exit 3) after this many seconds in all (default {DEADLINE_S})")


def run(args) -> int:
    from .trust import load_verified

    env = os.environ
    missing = [k for k in ("GITHUB_REPOSITORY", "GITHUB_TOKEN") if not env.get(k)]
    if missing:
        raise UsageError(f"ci notify: {', '.join(missing)} not set (GitHub Actions sets them; "
                         "the job needs `permissions: issues: write`)")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", env["GITHUB_REPOSITORY"]):
        raise UsageError(f"ci notify: GITHUB_REPOSITORY={env['GITHUB_REPOSITORY']!r} is not OWNER/NAME")
    new = load_verified(args.new, args.pubkey, insecure=args.insecure, quiet=True)[0]
    # OLD is old by design (diff's rule): its signature is checked, not its freshness.
    old = load_verified(args.old, args.pubkey, insecure=args.insecure, quiet=True, fresh=False)[0] \
        if args.old else Table(rows=[])
    gh = GitHub(env.get("GITHUB_API_URL") or "https://api.github.com", env["GITHUB_REPOSITORY"], env["GITHUB_TOKEN"],
                deadline_s=args.deadline)
    author = args.author or gh.identity() or (ACTIONS_BOT if env.get("GITHUB_ACTIONS") == "true" else None)
    if author is None:
        raise UsageError("ci notify: cannot tell which identity the token acts as (GET /user refused): pass "
                         "--author LOGIN, the account whose issues notify may touch")
    run_url = None
    if env.get("GITHUB_RUN_ID"):
        run_url = f"{env.get('GITHUB_SERVER_URL') or 'https://github.com'}/{env['GITHUB_REPOSITORY']}/actions/runs/{env['GITHUB_RUN_ID']}"
    actions = notify(gh, old, new, run_url, args.table_url, args.max_new, author)
    bad = regressed(old, new)
    for a in actions:
        print(f"#{a.number} {a.kind}: {a.id}")
    if not actions:
        print("no issue to open, update or close")
    if bad:
        print(f"{len(bad)} verified combination(s) regressed: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0
