"""The HTML pages of `hooked serve`: the status page and the login form.

Without a login, the status page shows counts only (queued, running, in flight, users with
requests); the model's name, which may be a filesystem path, and the requests per user are
shown to logged-in users (a browser session, or a bearer token).
"""

from __future__ import annotations

import html

STYLE = "body{font-family:system-ui,sans-serif;margin:2em;max-width:50em}td,th{padding:0 1em 0 0;text-align:left}"


def _page(title: str, body: str) -> str:
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body>{body}</body></html>"
    )


def status_page(snapshot: dict, model_cfg, user: str | None) -> str:
    """The status page; `user` None is an anonymous visitor (counts only)."""
    users = {u: c for u, c in snapshot["users"].items() if u != "*"}
    counts = (
        f"<p id='queue'>Queued: {snapshot['queued']}; running: {len(snapshot['running'])}; in flight: "
        f"{snapshot['in_flight']}; users with requests: {len(users)}; accepting: {snapshot['accepting']}</p>"
    )
    if user is None:
        body = (
            f"<h1>hooked serve</h1>{counts}"
            "<p><a href='/login'>Log in</a> for the model, the requests per user and the views of a prompt.</p>"
        )
        return _page("hooked serve", body)
    name = html.escape(str(model_cfg.model_name))
    rows = "".join(
        f"<tr><td>{html.escape(u)}</td><td>{c.get('requests', 0)}</td><td>{c.get('done', 0)}</td>"
        f"<td>{c.get('failed', 0)}</td></tr>"
        for u, c in sorted(users.items())
    )
    body = (
        f"<h1>hooked serve</h1><p id='model'>Model: <b>{name}</b> ({model_cfg.n_layers} layers, d_model "
        f"{model_cfg.d_model})</p>{counts}"
        f"<table id='users'><tr><th>user</th><th>requests</th><th>done</th><th>failed</th></tr>{rows}</table>"
        "<form method='get' action='/inspect'><p>Views of a prompt: <input name='prompt' size='50' "
        "placeholder='The Eiffel Tower is in the city of'> <button>Inspect</button></p></form>"
        f"<form method='post' action='/logout'><p>Logged in as {html.escape(user)}. <button>Log out</button></p>"
        "</form>"
    )
    return _page(f"hooked serve: {model_cfg.model_name}", body)


def login_page(next_path: str, error: str = "") -> str:
    """A form that exchanges a user's token for a browser session (the token is POSTed, never in a URL)."""
    message = f"<p id='error' style='color:#b00'>{html.escape(error)}</p>" if error else ""
    body = (
        f"<h1>hooked serve: log in</h1>{message}"
        "<form method='post' action='/login'>"
        f"<input type='hidden' name='next' value='{html.escape(next_path, quote=True)}'>"
        "<p><label>Token: <input type='password' name='token' autocomplete='current-password' size='40' "
        "autofocus></label> <button>Log in</button></p></form>"
        "<p>The token is the one your course gave you (the same as for <code>hooked.remote.connect</code>).</p>"
    )
    return _page("hooked serve: log in", body)


def safe_next(path: str) -> str:
    """A local path to return to after login (anything else becomes `/`: no open redirect)."""
    if not path.startswith("/") or path.startswith("//") or "\\" in path or any(ord(c) < 32 for c in path):
        return "/"
    return path


__all__ = ["login_page", "safe_next", "status_page"]
