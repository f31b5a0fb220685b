"""Sessions and CSRF for the pages. The session cookie holds a token's id, a prefix of its SHA-256 and a nonce,
signed with a secret derived from the service's signing keys (itsdangerous; it expires after ``SESSION_SECONDS``);
the raw token is never in it. A CSRF token is an HMAC of what it is bound to (the session cookie, or the sign-in
form's pre-session nonce) with the same derived secret."""

from __future__ import annotations

import hashlib
import hmac
import secrets as pysecrets

from itsdangerous import BadSignature, URLSafeTimedSerializer

from ...services.tokens import Principal, hash_token

SESSION_COOKIE = "pf_session"
LOGIN_COOKIE = "pf_login"
SESSION_SECONDS = 8 * 3600
LOGIN_SECONDS = 1800
SECRET_LABEL = b"preflight ui session v1"
COOKIE_PATH = "/ui"


def safe_next(value: str | None) -> str:
    """Where to go after sign-in: a path of this UI only (never another host: no open redirect)."""
    if (
        value
        and value.startswith("/ui/")
        and not value.startswith("//")
        and "\\" not in value
        and all(c.isprintable() for c in value)
        and len(value) <= 512
    ):
        return value
    return "/ui/"


class Sessions:
    """Signed, expiring session cookies and CSRF tokens, with secrets derived from the service's signing keys (any
    key of the directory verifies; the active one signs, so a key rotation does not sign everyone out)."""

    def __init__(self, keys):
        self.keys = keys

    def _secrets(self) -> list[bytes]:
        derived = self.keys.derived_secrets(SECRET_LABEL)
        active = self.keys.active_kid
        return [v for k, v in sorted(derived.items()) if k != active] + [
            derived[active]
        ]  # itsdangerous signs with the last

    def _serializer(self, salt: str) -> URLSafeTimedSerializer:
        return URLSafeTimedSerializer(self._secrets(), salt=salt)

    def issue(self, principal: Principal, secret: str) -> str:
        return self._serializer("session").dumps(
            {"t": principal.token_id or 0, "h": hash_token(secret)[:32], "n": pysecrets.token_urlsafe(8)}
        )

    def read(self, cookie: str | None) -> dict | None:
        if not cookie or len(cookie) > 1024:
            return None
        try:
            data = self._serializer("session").loads(cookie, max_age=SESSION_SECONDS)
        except BadSignature:  # includes SignatureExpired
            return None
        return (
            data
            if isinstance(data, dict) and isinstance(data.get("t"), int) and isinstance(data.get("h"), str)
            else None
        )

    def csrf(self, bound_to: str) -> str:
        return hmac.new(self._secrets()[-1], b"csrf\x00" + bound_to.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, bound_to: str | None, token: str | None) -> bool:
        if not bound_to or not token or len(token) != 64:
            return False
        return any(
            hmac.compare_digest(hmac.new(k, b"csrf\x00" + bound_to.encode(), hashlib.sha256).hexdigest(), token)
            for k in self._secrets()
        )
