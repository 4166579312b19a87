"""Who may use `jaxmem explore`'s server: the page opened from the URL it printed, and scripts given its token.

Loopback is no wall: every web page the user has open can send requests to 127.0.0.1, and a page whose
own hostname it rebinds to 127.0.0.1 can read the answers. So, as Jupyter's server does:

* the Host must be the server's own (127.0.0.1:PORT, localhost:PORT, [::1]:PORT): a rebound name is refused;
* a browser's cross-site request is refused: an Origin not the server's own, or Sec-Fetch-Site cross-site or
  same-site (another port of 127.0.0.1 is the same *site*, not the same origin);
* every /api call carries the server's random token (secrets.token_urlsafe): ``?token=``, the header
  X-Jaxmem-Token, or ``Authorization: token ...``. The page itself also opens with a cookie that
  the printed URL set (SameSite=Strict, HttpOnly, named by the port: cookies are not per port); an API call
  never does, since a cookie rides along on requests other pages make;
* no CORS header is ever sent, and the page may not be framed by another site (CSP frame-ancestors, and
  X-Frame-Options for older browsers) -- except by a notebook on this machine (jaxmem.explore() inlines the
  page in an iframe; the notebook's server sets JAXMEM_EXPLORE_EMBED=1 for its child).

Static files (the page's script and style, public code) need no token; they still need the Host and origin.
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Mapping

TOKEN_HEADER = "X-Jaxmem-Token"
EMBED_ENV = "JAXMEM_EXPLORE_EMBED"
# The notebook front ends that inline the page: Jupyter on this machine, VS Code's webviews
EMBEDDERS = ("'self'", "http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*", "https://127.0.0.1:*",
             "https://localhost:*", "https://[::1]:*", "vscode-webview:", "vscode-file:")
# The page's own files only; inline style attributes are the page's (it sets widths and colours)
_CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'")


def new_token() -> str:
    return secrets.token_urlsafe(24)


def cookie_name(port: int) -> str:
    return f"jaxmem-explore-{port}"


class Guard:
    """The server's rules for one port and token; `refusal` says why a request is refused (None: admitted)."""

    def __init__(self, port: int, token: str, *, embed: bool | None = None):
        self.port, self.token = port, token
        self.embed = os.environ.get(EMBED_ENV) == "1" if embed is None else embed
        self.hosts = {f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"}
        self.origins = {f"http://{h}" for h in self.hosts}

    # ------------------------------------------------------------------ the checks
    def refusal(self, path: str, headers: Mapping[str, str], params: Mapping[str, list[str]]) -> str | None:
        """Why a GET of `path` is refused (403), or None. `headers`: case-insensitive (http.server's)."""
        host = (headers.get("Host") or "").strip().lower()
        if host not in self.hosts:
            return (f"Host {host!r} is not this server's: it answers only 127.0.0.1:{self.port}, "
                    f"localhost:{self.port} or [::1]:{self.port} (a web page may not reach it under another name)")
        origin = headers.get("Origin")
        if origin is not None and origin.strip().lower() not in self.origins:
            return f"a request from the page of {origin!r}: the explorer answers only its own page"
        page = path in ("/", "/index.html")
        token = self._given(headers, params)
        site = (headers.get("Sec-Fetch-Site") or "").strip().lower()
        if site in ("cross-site", "same-site") and not (page and token == "valid"):
            return "a request another site's page made: the explorer answers only its own page"
        if token == "wrong" or (path.startswith("/api/") and token != "valid"):
            return self._no_token(token, page=page)
        if page and token != "valid" and not self._cookie(headers):
            return self._no_token(token, page=True)
        return None

    def _given(self, headers: Mapping[str, str], params: Mapping[str, list[str]]) -> str:
        """'valid', 'wrong' or 'none': the token a request names (query, header or Authorization)."""
        given = [*params.get("token", ())]
        if headers.get(TOKEN_HEADER) is not None:
            given.append(headers[TOKEN_HEADER])
        auth = (headers.get("Authorization") or "").strip()
        if auth.lower().startswith("token "):
            given.append(auth[6:].strip())
        if not given:
            return "none"
        return "valid" if all(hmac.compare_digest(g.encode(), self.token.encode()) for g in given) else "wrong"

    def _cookie(self, headers: Mapping[str, str]) -> bool:
        name = cookie_name(self.port)
        raws = headers.get_all("Cookie") if hasattr(headers, "get_all") else [headers.get("Cookie")]
        for raw in raws or ():
            for part in (raw or "").split(";"):
                k, _, v = part.strip().partition("=")
                if k == name and hmac.compare_digest(v.encode(), self.token.encode()):
                    return True
        return False

    @staticmethod
    def _no_token(token: str, *, page: bool = False) -> str:
        what = "a wrong token" if token == "wrong" else "no token"
        if page:
            return (f"{what}: open the URL `jaxmem explore` printed (it carries ?token=...), or jaxmem.explore()'s "
                    "url")
        return (f"{what}: every /api call carries the token of the URL `jaxmem explore` printed, as ?token=... or "
                f"the header {TOKEN_HEADER}")

    # ------------------------------------------------------------------ the headers
    def headers(self, ctype: str) -> dict[str, str]:
        """Every response's protective headers (no CORS header, ever)."""
        out = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
               "Cross-Origin-Resource-Policy": "same-origin"}
        ancestors = " ".join(EMBEDDERS) if self.embed else "'none'"
        csp = f"frame-ancestors {ancestors}"
        if ctype.startswith("text/html"):
            csp = f"{_CSP}; {csp}"
        out["Content-Security-Policy"] = csp
        if not self.embed:
            out["X-Frame-Options"] = "DENY"
        return out

    def set_cookie(self) -> str:
        return f"{cookie_name(self.port)}={self.token}; Path=/; HttpOnly; SameSite=Strict"

    def page(self, html: bytes) -> bytes:
        """The page with the token in a meta tag, where its script reads it (the page is served only to a
        request that showed the token or its cookie)."""
        tag = f'<meta name="jaxmem-token" content="{self.token}">'.encode()
        return html.replace(b"<head>", b"<head>\n" + tag, 1)
