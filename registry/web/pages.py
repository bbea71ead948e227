"""The pages: a site-relative path (and a query) to a response, the same for the live server and the static site.

Paths (every page also as `index.json`, or `?format=json` on the server)::

    index.html                                      the models
    models/<name>/index.html[?at=TIME]              a model; `at`: the aliases as they were then
    models/<name>/versions/<n>/index.html           a version (`?memory=GiB&context=N&cache_type=T` on the server)
    models/<name>/compare/<a>-<b>/index.html        two versions side by side
    models/<name>/compare/index.html?a=A&b=B        (server) the compare form: a redirect to the page above

Links are relative and name `index.html`, so that the static site reads the same from `file://` as from any web
server. Only pages are served, never a store file.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import posixpath
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any
from urllib.parse import quote

import jinja2

from registry.errors import NotFound, UsageError
from registry.units import human_size
from registry.web import documents, svg

SCHEMA_VERSION = 1
CSS = (resources.files("registry.web") / "templates" / "style.css").read_text(encoding="utf-8")
CSS_HASH = "sha256-" + base64.b64encode(hashlib.sha256(CSS.encode()).digest()).decode()
#: Nothing but the one inline style sheet (by its hash): no script, image, font, frame or connection at all.
CSP = f"default-src 'none'; style-src '{CSS_HASH}'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
#: The same in a static page's <meta> (where frame-ancestors is ignored, and browsers warn about it).
META_CSP = f"default-src 'none'; style-src '{CSS_HASH}'; form-action 'self'; base-uri 'none'"

_NAME = r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]{0,127})"
_LEAF = r"(?:index\.(?P<kind>html|json))?"
ROUTES: list[tuple[str, re.Pattern[str]]] = [
    ("models", re.compile(rf"^{_LEAF}$")),
    ("model", re.compile(rf"^models/{_NAME}/{_LEAF}$")),
    ("version", re.compile(rf"^models/{_NAME}/versions/(?P<n>[0-9]{{1,9}})/{_LEAF}$")),
    ("compare", re.compile(rf"^models/{_NAME}/compare/(?P<a>[0-9]{{1,9}})-(?P<b>[0-9]{{1,9}})/{_LEAF}$")),
    ("compare_form", re.compile(rf"^models/{_NAME}/compare/{_LEAF}$")),
]


@dataclass(frozen=True)
class Response:
    """One answer: status, content type, body; a redirect's relative location."""

    status: int
    content_type: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


_ENV = jinja2.Environment(loader=jinja2.PackageLoader("registry.web", "templates"),
                          autoescape=jinja2.select_autoescape(["html"], default=True),
                          undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
_ENV.filters["size"] = lambda n: "-" if n is None else human_size(int(n))
_ENV.filters["short"] = lambda s: (s or "")[:12]
_ENV.filters["when"] = lambda s: (s or "")[:19].replace("T", " ")


def page_path(kind: str, name: str = "", n: int = 0, a: int = 0, b: int = 0, leaf: str = "index.html") -> str:
    """The site-relative path of a page."""
    q = quote(name, safe="")
    return {"models": leaf, "model": f"models/{q}/{leaf}", "version": f"models/{q}/versions/{n}/{leaf}",
            "compare": f"models/{q}/compare/{a}-{b}/{leaf}"}[kind]


class Site:
    """Renders pages from a store; `live`: for the server (forms that ask it questions), else for a static site."""

    def __init__(self, reader: documents.Reader, *, live: bool) -> None:
        self.reader = reader
        self.live = live

    def respond(self, path: str, query: Mapping[str, str]) -> Response:
        """The response for a site-relative path: the page, its JSON twin, a redirect, or an error page."""
        html, json_twin = self.respond_both(path, query)
        return json_twin if json_twin is not None and (path.endswith(".json") or query.get("format") == "json") \
            else html

    def respond_both(self, path: str, query: Mapping[str, str]) -> tuple[Response, Response | None]:
        """A page and its JSON twin from one reading of the store (the twin is None for a redirect)."""
        found = next(((kind, m) for kind, pattern in ROUTES if (m := pattern.match(path)) is not None), None)
        if found is None:
            err = NotFound(f"no page at /{path}", hint="start at the models page")
            return self._error(path, 404, err), self._error(path, 404, err, as_json=True)
        kind, m = found
        page = posixpath.join(posixpath.dirname(path), "index.html")
        try:
            if kind == "compare_form":
                return self._compare_form(m["name"], query), None
            doc, template = self.document(kind, m.groupdict(), query)
        except documents.ItemError as e:
            status = 404 if isinstance(e, NotFound) else 400 if isinstance(e, UsageError) else 500
            return self._error(page, status, e), self._error(page, status, e, as_json=True)
        return self._html(template, page, doc), self._json(doc)

    def document(self, kind: str, groups: Mapping[str, str | None], query: Mapping[str, str]
                 ) -> tuple[dict[str, Any], str]:
        """A page's document and its template."""
        r, name = self.reader, groups.get("name") or ""
        if kind == "models":
            return documents.models_doc(r), "models.html"
        if kind == "model":
            from registry.release.aliases import parse_time

            at = parse_time(query["at"]) if self.live and query.get("at") else None
            return documents.model_doc(r, name, at), "model.html"
        if kind == "version":
            return documents.version_doc(r, name, int(groups["n"] or 0), **self._memory(query)), "version.html"
        return documents.compare_doc(r, name, int(groups["a"] or 0), int(groups["b"] or 0)), "compare.html"

    def _memory(self, query: Mapping[str, str]) -> dict[str, Any]:
        if not self.live:
            return {}
        try:
            memory = float(query["memory"]) if query.get("memory") else documents.DEFAULT_MEMORY_GIB
            context = int(query["context"]) if query.get("context") else None
        except ValueError:
            raise UsageError("memory is a number of GiB and context a number of tokens",
                             hint="e.g. ?memory=80&context=8192") from None
        return {"memory_gib": memory, "context": context, "cache_type": query.get("cache_type") or "f16"}

    def _compare_form(self, name: str, query: Mapping[str, str]) -> Response:
        a, b = query.get("a", ""), query.get("b", "")
        if not (self.live and a.isdigit() and b.isdigit()):
            raise UsageError("compare needs two version numbers", hint="e.g. compare/index.html?a=1&b=2")
        return Response(303, "text/plain; charset=utf-8", b"", {"Location": f"{int(a)}-{int(b)}/index.html"})

    def _json(self, doc: dict[str, Any], status: int = 200) -> Response:
        body = json.dumps({"schema_version": SCHEMA_VERSION, **doc}, default=str) + "\n"
        return Response(status, "application/json", body.encode())

    def _html(self, template: str, path: str, doc: dict[str, Any], status: int = 200) -> Response:
        here = posixpath.dirname(path)
        mine = here.split("/") if here else []

        def rel(target: str) -> str:
            """A link from this page to another site-relative path (posixpath.relpath, without its getcwd)."""
            parts = target.split("/")
            common = 0
            while common < min(len(mine), len(parts) - 1) and mine[common] == parts[common]:
                common += 1
            return "../" * (len(mine) - common) + "/".join(parts[common:])

        body = _ENV.get_template(template).render(
            doc=doc, rel=rel, page=page_path, live=self.live, css=CSS, meta_csp=META_CSP,
            json_link=rel(posixpath.join(here, "index.json")), timeline=svg.timeline, tradeoff=svg.tradeoff,
            rollout=svg.rollout, store=self.reader.store.location)
        return Response(status, "text/html; charset=utf-8", body.encode())

    def _error(self, path: str, status: int, err: BaseException, *, as_json: bool = False) -> Response:
        problem = documents.problem_doc(err)
        if as_json:  # the shape of the CLI's `--json` error document
            return self._json({"error": {**problem, "exit_code": getattr(err, "exit_code", 1)}}, status)
        return self._html("error.html", path, {"error": problem, "status": status}, status)


def rendered(site: Site, pages: list[str]) -> Iterator[tuple[str, bytes]]:
    """Every page and its JSON twin, as (site-relative path, body), each page rendered as it is asked for."""
    for path in pages:
        html, twin = site.respond_both(path, {})
        yield path, html.body
        if twin is not None:
            yield posixpath.join(posixpath.dirname(path), "index.json"), twin.body


def site_pages(reader: documents.Reader) -> list[str]:
    """Every page of the static site: the models, each model, each version, each version against the one before."""
    pages = [page_path("models")]
    for name in reader.store.models():
        pages.append(page_path("model", name))
        try:
            numbers = reader.store.versions(name)
        except documents.ItemError:
            continue  # the model page shows why
        pages += [page_path("version", name, n) for n in numbers]
        pages += [page_path("compare", name, a=a, b=b) for a, b in itertools.pairwise(numbers)]
    return pages
