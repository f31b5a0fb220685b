"""The operators' pages: signing in (the session cookie and CSRF token), and a page that loads nothing from another
host."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

from tests.support import ADMIN

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


def csrf_of(html: str) -> str:
    return re.search(r'name="csrf" value="([^"]*)"', html).group(1)


def login(client, token: str = ADMIN, next_: str = "/ui/"):
    """Sign in through the form (a client without the Authorization header); returns the response."""
    client.headers.pop("Authorization", None)
    form = client.get("/ui/login")
    return client.post(
        "/ui/login", data={"token": token, "csrf": csrf_of(form.text), "next": next_}, follow_redirects=False
    )
