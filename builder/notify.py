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
through urllib (envbuild.github_api). The token goes to the API's own origin only: a `Link: rel="next"` or a redirect
to any other origin is refused, pages are bounded, and every response must have the shape the
API documents. Every value taken from a table row goes into an issue as plain text (escaped, or
in a code span it cannot leave). An unreachable, refusing or misbehaving API is infrastructure
(exit 3).
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass

from .diff import compare
from .errors import VERDICT, UsageError
from .github_api import ACTIONS_BOT, DEADLINE_S, GitHub
from .query import unsettled
from .row import BROKEN, UNPINNED, VERIFIED, Row, Table

MARKER = "<!-- envbuild:combination={id} -->"
# One issue per row, and one per row and scope (`<id>@<scope>`: broken only for runs that opt in).
_MARKER_RE = re.compile(r"<!-- envbuild:combination=([A-Za-z0-9_.+-]+(?:@[A-Za-z0-9_.:,+-]+)?) -->")
EXCERPT_LINES = 40  # the tail of the failure detail: where the error is


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
    return sorted({c.id for c in compare(old, new).regressions if was.get(c.id) == VERIFIED})


def plan_actions(old: Table, new: Table) -> dict[str, str]:
    """{id: "broken" | "fixed" | "gone"} for rows whose issue may change. Fixed means every level
    that failed has passed since (query.unsettled): a row verified only below the failed level
    leaves its issue as it is, as an untested row does."""
    before = {r.id: r for r in old.rows}
    todo: dict[str, str] = {}
    for row in new.rows:
        if row.status == BROKEN:
            todo[row.id] = BROKEN
        elif row.status in (VERIFIED, UNPINNED) and not unsettled(row, before.get(row.id)):
            todo[row.id] = "fixed"
    for cid in before.keys() - {r.id for r in new.rows}:
        todo[cid] = "gone"
    for row in new.rows:  # per scope: a run that opts in is broken, or works again
        for sc in row.scopes:
            todo[f"{row.id}@{sc}"] = BROKEN
        old_row = before.get(row.id)
        for sc in (old_row.scopes if old_row else {}):
            if sc not in row.scopes and row.status != BROKEN:
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
        if what == BROKEN:
            row = rows_new[rid]
            title, body = title_of(row, scope), body_of(row, run_url, table_url, scope)
            before = rows_old.get(rid)
            newly = before is None or (scope not in before.scopes if scope else before.status != BROKEN)
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
        return VERDICT  # a regression: the nightly turns red
    return 0
