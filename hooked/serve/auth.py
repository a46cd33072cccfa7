"""Who is asking: bearer tokens per user, browser sessions, and the tokens file.

An API client sends `Authorization: Bearer <token>`; tokens are compared in constant time
against every known token. A browser logs in once through the form at `/login` and gets a
session cookie (HttpOnly, SameSite=Strict, Secure over HTTPS) that the pages (`/`, `/inspect`)
accept: the token never appears in a URL, a page or a log. The tokens file holds one
`user token` pair a line; a token shorter than 16 characters, a user named twice and a token
given to two users are refused, and a file that others can read draws a warning.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import re
import secrets
import stat
import time

from hooked.core.errors import HookedError, InputError, WireError

logger = logging.getLogger("hooked.serve")
#: Shortest token accepted in a tokens file (characters).
MIN_TOKEN_LENGTH = 16
#: How long a browser session lasts (seconds).
SESSION_S = 8 * 3600
COOKIE = "hooked_session"


class Auth:
    """Bearer tokens per user, compared in constant time against every known token; browser sessions."""

    def __init__(self, tokens: dict[str, str] | None):
        self.tokens = {user: token.encode() for user, token in (tokens or {}).items()}
        self.sessions: dict[str, tuple[str, float]] = {}  # session id -> (user, expiry)

    @property
    def enabled(self) -> bool:
        return bool(self.tokens)

    def user_of_token(self, given: str) -> str | None:
        found = None
        for user, token in self.tokens.items():  # no early exit: the time does not depend on which matched
            if hmac.compare_digest(token, given.strip().encode()):
                found = user
        return found

    def user(self, request, cookie: bool = False) -> str:
        """The user a request authenticates as (401 otherwise); `cookie` also accepts a browser session."""
        if not self.enabled:
            return "local"
        header = request.headers.get("authorization", "")
        if not header and cookie:
            user = self.session_user(request.cookies.get(COOKIE, ""))
            if user is not None:
                return user
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given:
            raise WireError("missing 'Authorization: Bearer <token>' header (browsers: log in at /login)", 401)
        found = self.user_of_token(given)
        if found is None:
            raise WireError("unknown token", 401)
        return found

    def start_session(self, user: str) -> str:
        now = time.monotonic()
        self.sessions = {k: v for k, v in self.sessions.items() if v[1] > now}  # forget expired ones
        session = secrets.token_urlsafe(32)
        self.sessions[session] = (user, now + SESSION_S)
        return session

    def session_user(self, session: str) -> str | None:
        entry = self.sessions.get(session) if session else None
        if entry is None or entry[1] < time.monotonic():
            return None
        return entry[0]

    def end_session(self, session: str) -> None:
        self.sessions.pop(session, None)


def parse_tokens(text: str) -> dict[str, str]:
    """`user token` pairs, one per line (or separated by commas); blank lines and `#` comments skipped."""
    out: dict[str, str] = {}
    owners: dict[str, str] = {}
    for n, line in enumerate(text.replace(",", "\n").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise HookedError(f"tokens line {n}: expected 'user token', got {len(parts)} fields")
        user, token = parts
        if not re.fullmatch(r"[A-Za-z0-9_.@-]{1,64}", user):
            raise HookedError(f"tokens line {n}: user names are 1-64 letters, digits or _.@- (got {user[:64]!r})")
        if len(token) < MIN_TOKEN_LENGTH:
            raise HookedError(f"tokens line {n}: the token of {user!r} is shorter than {MIN_TOKEN_LENGTH} characters")
        if user in out:
            raise HookedError(f"tokens line {n}: user {user!r} appears twice")
        if token in owners:
            raise HookedError(
                f"tokens line {n}: {user!r} has the same token as {owners[token]!r}: give every user their own token"
            )
        out[user], owners[token] = token, user
    return out


def read_tokens_file(path: str) -> dict[str, str]:
    """`parse_tokens` of the file at `path`, with a warning when users other than its owner can read it."""
    mode = os.stat(path).st_mode
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        who = "everyone" if mode & stat.S_IROTH else "its group"
        logger.warning(
            f"the tokens file {path} is readable by {who}: anyone who can read it can act as any user "
            f"(chmod 600 {path})"
        )
    with open(path, encoding="utf-8") as f:
        return parse_tokens(f.read())


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_tokens(
    host: str, tokens: dict[str, str] | None, no_auth: bool = False
) -> tuple[dict[str, str] | None, str | None]:
    """The tokens to enforce, and a one-time token generated for a loopback server started without any.

    A non-loopback address needs tokens; `no_auth` is refused there too.
    """
    if tokens:
        return tokens, None
    if not is_loopback(host):
        raise InputError(
            f"refusing to serve on {host} without authentication: pass --tokens FILE (or set HOOKED_SERVE_TOKENS) "
            "with one 'user token' pair per line, or bind 127.0.0.1"
        )
    if no_auth:
        return None, None
    token = secrets.token_urlsafe(24)
    return {"local": token}, token


__all__ = [
    "Auth",
    "COOKIE",
    "MIN_TOKEN_LENGTH",
    "is_loopback",
    "parse_tokens",
    "read_tokens_file",
    "resolve_tokens",
]
