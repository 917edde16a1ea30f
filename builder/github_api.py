"""The GitHub REST API as `envbuild ci notify` uses it (issues and labels of one repository),
bounded: an overall deadline, a cap on each response and on the pages of a listing, Retry-After
honoured up to a bound, no redirect to another origin (the token stays with its host). Every
failure is an InfraError (exit 3).
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request

from .errors import InfraError

LABEL = "envbuild"  # the label of envbuild's issues: the only ones listed, and every one it opens carries it
API_VERSION = "2022-11-28"
MAX_PAGES = 50  # 5,000 issues at 100 a page: more is a server that never ends its Link chain
MAX_RESPONSE_BYTES = 16 << 20
DEADLINE_S = 600  # the whole run: a server that answers slowly cannot hold the nightly
MAX_RETRY_WAIT_S = 60  # the longest Retry-After notify honours (GitHub's secondary rate limit)
MAX_RETRIES = 3
ACTIONS_BOT = "github-actions[bot]"  # who GITHUB_TOKEN's issues are by (its /user is refused)



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
