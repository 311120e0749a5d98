"""AWS Signature Version 4 for the direct request path: the header botocore's ``SigV4Auth``
computes, for the one request form that path sends, at a fraction of the CPU.

The direct path sends only JSON-protocol POSTs to an endpoint URL without a query string, with
a small fixed set of headers. botocore's signer is general (any method, query, header set,
streaming body) and rebuilds its header maps several times per request; here the parts that do
not change between requests (the canonical path and query, the host, the credential scope's
signing key for a day) are computed once, and each request costs a body hash and two HMACs.
The result is byte-for-byte botocore's (``tests/adapters/test_sigv4.py`` compares both on the
same request and timestamp, with and without a session token); the scope and the host use
botocore's own helpers.

Owns: ``Scope`` (one endpoint URL, region and service) and its ``sign``.
Must not: choose credentials (the caller passes the client's, frozen for this request), read
the clock (the caller passes the timestamp) or send anything.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import MutableMapping
from typing import Any
from urllib.parse import urlsplit

from botocore import auth as botocore_auth

# botocore's helpers for the host and the canonical path (untyped, private, stable for years).
_auth: Any = botocore_auth
_SKIPPED = frozenset(_auth.SIGNED_HEADERS_BLACKLIST)


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode("utf-8"), hashlib.sha256).digest()


class Scope:
    """Signs requests to one endpoint URL for one region and service."""

    def __init__(self, url: str, region: str, service: str) -> None:
        self.region = region
        self.service = service
        self.host: str = _auth._host_from_url(url)
        parts = urlsplit(url)
        if parts.query:
            raise ValueError("an endpoint URL with a query string is signed by botocore")
        helper = _auth.SigV4Auth.__new__(_auth.SigV4Auth)  # its path normaliser only
        self._path: str = helper._normalize_url_path(parts.path)
        self._keys: dict[tuple[str, str], bytes] = {}

    def _key(self, secret: str, day: str) -> bytes:
        key = self._keys.get((secret, day))
        if key is None:
            k = _hmac(f"AWS4{secret}".encode(), day)
            k = _hmac(_hmac(_hmac(k, self.region), self.service), "aws4_request")
            if len(self._keys) > 4:
                self._keys.clear()
            key = self._keys[(secret, day)] = k
        return key

    def sign(
        self,
        headers: MutableMapping[str, str],
        body: bytes,
        timestamp: str,
        access_key: str,
        secret_key: str,
        token: str | None,
    ) -> None:
        """Add ``X-Amz-Date``, ``X-Amz-Security-Token`` (with a token) and ``Authorization``
        to ``headers`` (distinct names, no ``Date`` or ``Authorization`` yet) for a POST of
        ``body``; ``timestamp`` is ``YYYYMMDDTHHMMSSZ`` in UTC."""
        headers["X-Amz-Date"] = timestamp
        if token:
            headers["X-Amz-Security-Token"] = token
        signed: dict[str, str] = {"host": self.host}
        for name, value in headers.items():
            lower = name.lower()
            if lower not in _SKIPPED:
                signed[lower] = " ".join(value.split())
        names = sorted(signed)
        signed_names = ";".join(names)
        canonical = "\n".join(
            (
                "POST",
                self._path,
                "",
                "\n".join(f"{n}:{signed[n]}" for n in names) + "\n",
                signed_names,
                hashlib.sha256(body).hexdigest(),
            )
        )
        day = timestamp[:8]
        scope = f"{day}/{self.region}/{self.service}/aws4_request"
        to_sign = (
            f"AWS4-HMAC-SHA256\n{timestamp}\n{scope}\n"
            f"{hashlib.sha256(canonical.encode('utf-8')).hexdigest()}"
        )
        signature = hmac.new(
            self._key(secret_key, day), to_sign.encode("utf-8"), hashlib.sha256
        ).hexdigest()
        headers["Authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, "
            f"SignedHeaders={signed_names}, Signature={signature}"
        )
