"""A package index on 127.0.0.1 for tests: PEP 691 JSON and PEP 503 HTML over real files.

    idx = LocalIndex()                                  # started on a free port, stopped by .close()
    idx.add("simple", "six-1.17.0-py2.py3-none-any.whl", uploaded="2024-12-04T00:00:00Z")
    idx.url("simple")  -> http://127.0.0.1:PORT/simple

A page is `/<root>/<project>/` (a PyTorch-like layout is `cu128/torch/`), files are served from
`/files/<root>/<filename>` with HTTP range support (uv and envbuild read wheel metadata by range).
Upload times are whatever the test says, so "every release postdates the era" can be staged with
real wheels. `html=True` roots answer PEP 503 HTML only, as the public PyTorch index does.
"""

from __future__ import annotations

import hashlib
import html
import json
import re
import shutil
import threading
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename


def project_of(filename: str) -> str:
    name = parse_wheel_filename(filename)[0] if filename.endswith(".whl") else parse_sdist_filename(filename)[0]
    return canonicalize_name(name)


class LocalIndex:
    def __init__(self, workdir: Path):
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.files: dict[tuple[str, str], list[dict]] = {}  # (root, project) -> entries
        self.html_roots: set[str] = set()
        self.requests: list[str] = []  # "GET /cu128/torch/", "GET /files/... [range]"
        index = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_HEAD(self):
                self.do_GET(head=True)

            def do_GET(self, head=False):
                index.requests.append(f"{self.command} {self.path}" + (" [range]" if self.headers.get("Range") else ""))
                parts = [p for p in self.path.split("?")[0].split("/") if p]
                if len(parts) == 3 and parts[0] == "files":
                    return self._file(index.dir / parts[1] / parts[2], head)
                if len(parts) == 2:
                    return self._page(parts[0], canonicalize_name(parts[1]), head)
                self.send_error(404)

            def _page(self, root, project, head):
                entries = index.files.get((root, project))
                if entries is None:
                    return self.send_error(404)
                want_json = "application/vnd.pypi.simple.v1+json" in (self.headers.get("Accept") or "")
                if want_json and root not in index.html_roots:
                    body = json.dumps({"meta": {"api-version": "1.1"}, "name": project, "files": [
                        {"filename": e["filename"], "url": f"/files/{root}/{e['filename']}",
                         "hashes": {"sha256": e["sha256"]}, "size": e["size"], "upload-time": e["uploaded"],
                         "yanked": e.get("yanked", False)} for e in entries]}).encode()
                    ctype = "application/vnd.pypi.simple.v1+json"
                else:
                    links = "".join(f'<a href="/files/{root}/{html.escape(e["filename"])}#sha256={e["sha256"]}"'
                                    + (f' data-yanked="{html.escape(str(e["yanked"]))}"' if e.get("yanked") else "") + '>'
                                    f'{html.escape(e["filename"])}</a><br/>\n' for e in entries)
                    body = f"<!DOCTYPE html><html><body>\n{links}</body></html>\n".encode()
                    ctype = "text/html"
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _file(self, path: Path, head):
                if not path.is_file():
                    return self.send_error(404)
                size = path.stat().st_size
                start, end = 0, size - 1
                m = re.match(r"bytes=(\d*)-(\d*)$", self.headers.get("Range") or "")
                if m:
                    if m.group(1):
                        start, end = int(m.group(1)), int(m.group(2) or size - 1)
                    else:  # a suffix range: the last N bytes
                        start = max(0, size - int(m.group(2)))
                    end = min(end, size - 1)
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
                else:
                    self.send_response(200)
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(end - start + 1))
                self.send_header("Content-Type", "application/octet-stream")
                self.end_headers()
                if head:
                    return
                with open(path, "rb") as f:
                    f.seek(start)
                    left = end - start + 1
                    while left > 0:
                        chunk = f.read(min(left, 1 << 20))
                        if not chunk:
                            break
                        self.wfile.write(chunk)
                        left -= len(chunk)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def url(self, root: str) -> str:
        return f"{self.root_url}/{root}"

    def add(self, root: str, src: Path, uploaded: str, name: str | None = None, yanked: str | None = None) -> dict:
        """Serve the real file `src` under `root` (as `name`, when given), uploaded at `uploaded`;
        `yanked`: the reason it was yanked (PEP 592)."""
        name = name or Path(src).name
        dest = self.dir / root / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if Path(src).resolve() != dest.resolve():
            shutil.copyfile(src, dest)
        h = hashlib.sha256()
        with open(dest, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        entry = {"filename": name, "sha256": h.hexdigest(), "size": dest.stat().st_size, "uploaded": uploaded}
        if yanked:
            entry["yanked"] = yanked
        self.files.setdefault((root, project_of(name)), []).append(entry)
        return entry

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def fetch_from_index(index_url: str, project: str, filename: str, dest_dir: Path) -> Path:
    """Download one real file of `project` from the configured index (cached in dest_dir)."""
    from envbuild.index import Metadata, _open

    dest = Path(dest_dir) / filename
    if dest.is_file():
        return dest
    meta = Metadata(index=index_url)
    for f in meta.files(project):
        if f["filename"] == filename:
            url = urllib.parse.urljoin(f"{index_url}/{canonicalize_name(project)}/", f["url"])
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_suffix(".part")
            with _open(url, timeout=120) as r, open(tmp, "wb") as out:
                shutil.copyfileobj(r, out)
            tmp.rename(dest)
            return dest
    raise FileNotFoundError(f"{filename} is not on the index")



def find_local_wheel(pattern: str) -> Path | None:
    """A real wheel already on this machine (pip's find-links folders), e.g. a CPU torch build."""
    import configparser
    import os

    dirs = [d for d in os.environ.get("PIP_FIND_LINKS", "").split() if d]
    for conf in (Path.home() / ".config/pip/pip.conf", Path("/etc/pip.conf")):
        cp = configparser.RawConfigParser()
        try:
            cp.read(conf)
            dirs += cp.get("global", "find-links", fallback="").split()
        except (configparser.Error, OSError):
            pass
    for d in dirs:
        d = Path(d.removeprefix("file://"))
        if d.is_dir():
            hits = sorted(d.glob(pattern))
            if hits:
                return hits[-1]
    return None


def relabel_wheel(src: Path, dest_dir: Path, old_local: str, new_local: str) -> Path:
    """The same wheel under another local version (torch 2.13.0+cpu -> 2.13.0+cu128), with its
    metadata kept consistent: file name, .dist-info folder, METADATA's Version and RECORD agree.
    The zip's other members are copied as they are (`zip -d` / `zip` add, no recompression)."""
    import base64
    import subprocess
    import tempfile
    import zipfile

    name = src.name.replace(f"+{old_local}-", f"+{new_local}-")
    dest = Path(dest_dir) / name
    if dest.is_file():
        return dest
    old_di = src.name.split("-")[0] + "-" + src.name.split("-")[1] + ".dist-info"
    new_di = old_di.replace(f"+{old_local}", f"+{new_local}")
    tmp = dest.with_suffix(".part")
    shutil.copyfile(src, tmp)
    with tempfile.TemporaryDirectory() as work, zipfile.ZipFile(src) as z:
        members = [n for n in z.namelist() if n.startswith(old_di + "/")]
        for n in members:
            target = Path(work) / (new_di + n[len(old_di):])
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(z.read(n))
        meta = Path(work) / new_di / "METADATA"
        text = meta.read_text()
        text = re.sub(r"^Version: .*$", "Version: " + parse_wheel_filename(name)[1].public
                      + f"+{new_local}", text, count=1, flags=re.M)
        meta.write_text(text)
        digest = base64.urlsafe_b64encode(hashlib.sha256(meta.read_bytes()).digest()).rstrip(b"=").decode()
        record = Path(work) / new_di / "RECORD"
        lines = []
        for line in record.read_text().splitlines():
            line = line.replace(old_di + "/", new_di + "/")
            if line.startswith(new_di + "/METADATA,"):
                line = f"{new_di}/METADATA,sha256={digest},{meta.stat().st_size}"
            lines.append(line)
        record.write_text("\n".join(lines) + "\n")
        subprocess.run(["zip", "-q", "-d", str(tmp), f"{old_di}/*"], check=True)
        subprocess.run(["zip", "-q", "-r", str(tmp), new_di], cwd=work, check=True)
    tmp.rename(dest)
    return dest
