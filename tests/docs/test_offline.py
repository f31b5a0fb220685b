"""Docs that work offline: /docs and every asset it loads come from the service itself (a Python package, no CDN),
with the Authorize button (bearer scheme) and a description on every operation."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

from service.api.openapi_doc import PUBLIC

URL_ATTRS = {"src", "href", "action", "formaction", "poster", "data"}


class _Refs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.refs: list[str] = []
        self.inline: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        for k, v in attrs:
            if k in URL_ATTRS and v:
                self.refs.append(v)
            if k == "style" and v:
                self.refs += re.findall(r"url\(\s*['\"]?([^'\")]+)", v)
        self._in_script = tag in ("script", "style")

    def handle_endtag(self, tag):
        self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.inline.append(data)


def page_refs(html: str) -> tuple[list[str], list[str]]:
    """(URLs the page's attributes name, text of its inline scripts and styles)."""
    p = _Refs()
    p.feed(html)
    return p.refs, p.inline


def foreign(url: str, base: str = "http://testserver/") -> bool:
    """True when ``url`` would be fetched from another host than the page's (or is not http at all but data:)."""
    if url.startswith(("#", "mailto:")):
        return False
    full = urlsplit(urljoin(base, url))
    return full.scheme not in ("http", "https") or full.netloc != urlsplit(base).netloc


def css_urls(css: str) -> list[str]:
    return re.findall(r"url\(\s*['\"]?([^'\")]+)", css) + re.findall(r"@import\s+['\"]([^'\"]+)", css)


def assert_page_is_local(client, path: str, seen: set[str] | None = None) -> set[str]:
    """Fetch ``path``, every asset it names (and every url() of its CSS): all from this host, all 200."""
    seen = seen if seen is not None else set()
    r = client.get(path)
    assert r.status_code == 200, (path, r.status_code)
    refs, inline = page_refs(r.text)
    for text in inline:
        for url in re.findall(r"https?://[^\s'\"<>)]+", text):
            raise AssertionError(f"{path}: inline script or style names {url}")
    for ref in refs:
        assert not foreign(ref), f"{path} points to another host: {ref}"
        url = urljoin("http://testserver" + path, ref)
        target = urlsplit(url).path
        if target in seen or ref.startswith("#"):
            continue
        seen.add(target)
        if target.endswith(".css"):
            css = client.get(target)
            assert css.status_code == 200, target
            for u in css_urls(css.text):
                assert u.startswith("data:") or not foreign(u), f"{target} loads {u}"
        elif re.search(r"\.(js|png|ico|svg|woff2?)$", target):
            assert client.get(target).status_code == 200, target
    return seen


def test_docs_page_and_assets_are_served_locally(client):
    r = client.get("/docs")
    assert r.status_code == 200 and "SwaggerUIBundle" in r.text
    assert "cdn.jsdelivr" not in r.text and "fastapi.tiangolo.com" not in r.text and "unpkg" not in r.text
    seen = assert_page_is_local(client, "/docs")
    assert {"/docs/assets/swagger-ui-bundle.js", "/docs/assets/swagger-ui.css"} <= seen
    js = client.get("/docs/assets/swagger-ui-bundle.js")
    assert js.headers["content-type"].startswith("text/javascript") and len(js.content) > 500_000
    assert '"validatorUrl": null' in r.text  # no badge image from validator.swagger.io
    assert client.get("/redoc").status_code == 404  # FastAPI's ReDoc page loads from a CDN: not offered
    assert client.get("/docs/assets/../app.py").status_code == 404
    assert client.get("/docs/assets/__init__.py").status_code == 404


def test_openapi_has_bearer_scheme_and_descriptions(client):
    doc = client.get("/openapi.json").json()
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer", "description": doc["components"]["securitySchemes"]["bearer"]["description"]}
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert op.get("description", "").strip(), f"{method} {path} ({op['operationId']}) has no description"
            if op["operationId"] in PUBLIC:
                assert "security" not in op
            else:
                assert op["security"] == [{"bearer": []}], op["operationId"]
