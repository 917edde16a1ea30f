"""`envbuild ci notify NEW --old OLD`: one GitHub issue per broken combination, kept in step with the table.

Both tables are verified first (as `envbuild diff` does). Then, per combination:
  newly broken     (not broken in OLD, broken in NEW; "unsatisfiable" when its lock has no
                   solution)   -> open an issue, or reopen/update the one it had before
  still broken     with a different failure -> update the issue and comment what changed
  fixed            (verified or passed in NEW) -> close its open issue with a comment
  gone             (no row in NEW) -> close its open issue: the matrix no longer has it
An untested row (infrastructure, no verdict) leaves its issue as it is. Each issue carries a
hidden marker naming its combination, so a later run finds it again (open or closed) and a
combination never has two issues. Exit 1 when a row that was verified in OLD regressed (a
level that passed now fails): that is what must turn the nightly red.

GitHub's REST API (GITHUB_API_URL, GITHUB_REPOSITORY, GITHUB_TOKEN: what Actions provides)
through urllib; an unreachable or refusing API is infrastructure (exit 3).
"""

from __future__ import annotations

import json
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from .diff import compare
from .errors import InfraError, UsageError
from .row import Table
from .verify import load_verified

LABEL = "envbuild"
MARKER = "<!-- envbuild:combination={id} -->"
_MARKER_RE = re.compile(r"<!-- envbuild:combination=(\S+) -->")
EXCERPT_LINES = 40  # the tail of the failure detail: where the error is
API_VERSION = "2022-11-28"


# ---------------------------------------------------------------- the GitHub REST API


class GitHub:
    """The few issue endpoints notify needs (docs.github.com/rest/issues)."""

    def __init__(self, api: str, repo: str, token: str, timeout: float = 30):
        self.api, self.repo, self.token, self.timeout = api.rstrip("/"), repo, token, timeout

    def _call(self, method: str, path: str, body: dict | None = None) -> tuple[object, dict]:
        url = path if path.startswith("http") else f"{self.api}/repos/{self.repo}{path}"
        req = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Accept": "application/vnd.github+json",
                                              "Authorization": f"Bearer {self.token}",
                                              "X-GitHub-Api-Version": API_VERSION,
                                              "Content-Type": "application/json",
                                              "User-Agent": "envbuild-notify"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                raw = r.read()
                return (json.loads(raw) if raw else None), dict(r.headers)
        except urllib.error.HTTPError as e:
            msg = e.read()[:300].decode(errors="replace")
            raise InfraError("github-api", f"{method} {url}: HTTP {e.code} {msg}") from None
        except (urllib.error.URLError, OSError, json.JSONDecodeError) as e:
            raise InfraError("github-api", f"{method} {url}: {e}") from None

    def issues(self) -> list[dict]:
        """Every issue with the envbuild label, open or closed (pull requests left out)."""
        out: list[dict] = []
        url: str | None = f"/issues?state=all&labels={LABEL}&per_page=100"
        while url:
            page, headers = self._call("GET", url)
            out += [i for i in page or [] if isinstance(i, dict) and "pull_request" not in i]
            nxt = re.search(r'<([^>]+)>;\s*rel="next"', headers.get("Link") or headers.get("link") or "")
            url = nxt.group(1) if nxt else None
        return out

    def create(self, title: str, body: str) -> dict:
        return self._call("POST", "/issues", {"title": title, "body": body, "labels": [LABEL]})[0]

    def update(self, number: int, **fields) -> dict:
        return self._call("PATCH", f"/issues/{number}", fields)[0]

    def comment(self, number: int, body: str) -> None:
        self._call("POST", f"/issues/{number}/comments", {"body": body})


# ---------------------------------------------------------------- what to say


def _status(row: dict | None) -> str | None:
    return row.get("status") if isinstance(row, dict) else None


def _failure(row: dict) -> dict:
    f = row.get("failure")
    return f if isinstance(f, dict) else {}


def title_of(cid: str, row: dict) -> str:
    f = _failure(row)
    if f.get("cause") == "unsatisfiable":
        return f"envbuild: {cid} is unsatisfiable"
    return f"envbuild: {cid} broken at {f.get('level') or '?'} ({f.get('cause') or 'failed'})"


def body_of(cid: str, row: dict, run_url: str | None, table_url: str | None) -> str:
    f, combo, img = _failure(row), row.get("combo") or {}, row.get("image") or {}
    detail = "\n".join(str(f.get("detail") or "").rstrip().splitlines()[-EXCERPT_LINES:])
    lines = [MARKER.format(id=cid), "",
             f"The nightly found **{cid}** broken at **{f.get('level') or '?'}**: `{f.get('cause') or 'failed'}`.", "",
             "| verl | engine | torch | CUDA | Python |", "|---|---|---|---|---|",
             "| " + " | ".join(str(x) for x in (combo.get("verl", ""), f"{combo.get('engine', '')} "
                                                  f"{combo.get('engine_version') or ''}".strip(),
                                                  combo.get("torch", ""), combo.get("cuda", ""),
                                                  combo.get("python", ""))) + " |", ""]
    if img.get("pinned"):
        lines += [f"Image: `{img['pinned']}`", ""]
    if detail:
        lines += ["Log excerpt:", "", "```", detail.replace("```", "'''"), "```", ""]
    links = [f"[run]({run_url})"] if run_url else []
    if table_url:
        links.append(f"[table]({table_url})")
    lines += [("See " + " · ".join(links) + ". " if links else "")
              + "This issue is opened and closed by `envbuild ci notify`; it closes when the combination passes."]
    return "\n".join(lines) + "\n"


@dataclass
class Action:
    kind: str  # opened | reopened | updated | closed
    id: str
    number: int


def regressed(old: Table, new: Table) -> list[str]:
    """Rows verified in OLD with a level that passed there and fails now (`envbuild diff`'s rule)."""
    was = {r.id: r.status for r in old.rows}
    return sorted({c.id for c in compare(old, new).regressions if was.get(c.id) == "verified"})


def plan_actions(old: dict, new: dict) -> dict[str, str]:
    """{id: "broken" | "fixed" | "gone"} for rows whose issue may change. Rows are read as the
    published JSON (by key), which stays the same whatever the in-memory row type."""
    a = {r["id"]: r for r in old.get("rows", []) if isinstance(r, dict) and isinstance(r.get("id"), str)}
    b = {r["id"]: r for r in new.get("rows", []) if isinstance(r, dict) and isinstance(r.get("id"), str)}
    todo: dict[str, str] = {}
    for cid, row in b.items():
        if _status(row) == "broken":
            todo[cid] = "broken"
        elif _status(row) in ("verified", "unpinned"):
            todo[cid] = "fixed"
    for cid in a.keys() - b.keys():
        todo[cid] = "gone"
    return todo


def notify(gh: GitHub, old: dict, new: dict, run_url: str | None = None, table_url: str | None = None,
           max_new: int = 30) -> list[Action]:
    todo = plan_actions(old, new)
    rows_old = {r.get("id"): r for r in old.get("rows", []) if isinstance(r, dict)}
    rows_new = {r.get("id"): r for r in new.get("rows", []) if isinstance(r, dict)}
    mine: dict[str, dict] = {}
    for issue in sorted(gh.issues(), key=lambda i: i.get("number", 0)):
        m = _MARKER_RE.search(issue.get("body") or "")
        if m and (m.group(1) not in mine or issue.get("state") == "open"):
            mine[m.group(1)] = issue  # an open one wins over an older closed one
    actions: list[Action] = []
    opened = 0
    for cid in sorted(todo):
        what, issue = todo[cid], mine.get(cid)
        is_open = bool(issue) and issue.get("state") == "open"
        if what == "broken":
            row = rows_new[cid]
            title, body = title_of(cid, row), body_of(cid, row, run_url, table_url)
            newly = _status(rows_old.get(cid)) != "broken"
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
                gh.comment(issue["number"], f"Broken again: {title.removeprefix('envbuild: ')}.")
                actions.append(Action("reopened", cid, issue["number"]))
            elif (issue.get("title"), issue.get("body")) != (title, body):
                was = issue.get("title") or ""
                gh.update(issue["number"], title=title, body=body)
                if was != title:
                    gh.comment(issue["number"], f"Still broken, now: {title.removeprefix('envbuild: ')} "
                                                f"(was: {was.removeprefix('envbuild: ')}).")
                actions.append(Action("updated", cid, issue["number"]))
        elif is_open:
            why = (f"Fixed: {cid} is {_status(rows_new.get(cid))} in the new table"
                   + (f" (up to {rows_new[cid].get('best_level')})" if what == "fixed" and rows_new[cid].get("best_level") else "")
                   if what == "fixed" else f"{cid} is no longer in the table (the matrix dropped it)")
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


def run(args) -> int:
    env = os.environ
    missing = [k for k in ("GITHUB_REPOSITORY", "GITHUB_TOKEN") if not env.get(k)]
    if missing:
        raise UsageError(f"ci notify: {', '.join(missing)} not set (GitHub Actions sets them; "
                         "the job needs `permissions: issues: write`)")
    new = load_verified(args.new, args.pubkey, insecure=args.insecure, quiet=True)[0]
    # OLD is old by design (diff's rule): its signature is checked, not its freshness.
    old = load_verified(args.old, args.pubkey, insecure=args.insecure, quiet=True, fresh=False)[0] \
        if args.old else Table(rows=[])
    gh = GitHub(env.get("GITHUB_API_URL") or "https://api.github.com", env["GITHUB_REPOSITORY"], env["GITHUB_TOKEN"])
    run_url = None
    if env.get("GITHUB_RUN_ID"):
        run_url = f"{env.get('GITHUB_SERVER_URL') or 'https://github.com'}/{env['GITHUB_REPOSITORY']}/actions/runs/{env['GITHUB_RUN_ID']}"
    actions = notify(gh, old.to_dict(), new.to_dict(), run_url, args.table_url, args.max_new)
    bad = regressed(old, new)
    for a in actions:
        print(f"#{a.number} {a.kind}: {a.id}")
    if not actions:
        print("no issue to open, update or close")
    if bad:
        print(f"{len(bad)} verified combination(s) regressed: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0
