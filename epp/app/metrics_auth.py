"""`--metrics-endpoint-auth`: `/metrics` (and `/debug/*` on the same port) only for a bearer token the API server
accepts (TokenReview) and authorizes for `get` on the non-resource URL `/metrics` (SubjectAccessReview).

Verdicts are cached per token for `ttl_s` (10 s; denials too, so a scraper with a bad token costs the API server
two calls per 10 s, not two per scrape), at most `MAX_CACHED` tokens. The reviews run in a worker thread; the
serving loop never waits on the API server.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from typing import Protocol

MAX_CACHED = 1024
_MAX_TOKEN_BYTES = 16384  # a bearer token longer than this is refused without asking the API server


class Reviewer(Protocol):
    def review(self, token: str) -> tuple[int, str]: ...


class MetricsAuth:
    def __init__(self, reviewer: Reviewer, ttl_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._reviewer = reviewer
        self._ttl_s = ttl_s
        self._clock = clock
        self._cache: dict[bytes, tuple[float, int, str]] = {}  # sha256(token) → (expires, status, reason)

    async def check(self, header: str) -> tuple[int, str] | None:
        """None when a request with this `Authorization` header may go on; otherwise (401/403/503, reason)."""
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or len(token) > _MAX_TOKEN_BYTES:
            return 401, "a bearer token is required (--metrics-endpoint-auth)"
        key = hashlib.sha256(token.encode("utf-8", "replace")).digest()
        now = self._clock()
        cached = self._cache.get(key)
        if cached is None or cached[0] <= now:
            status, reason = await asyncio.to_thread(self._reviewer.review, token)
            if status != 503:  # an unreachable API server is asked again next time
                if len(self._cache) >= MAX_CACHED:
                    self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
                    if len(self._cache) >= MAX_CACHED:
                        self._cache.clear()
                self._cache[key] = (now + self._ttl_s, status, reason)
        else:
            _, status, reason = cached
        return None if status == 200 else (status, reason)
