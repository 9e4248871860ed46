"""API keys and per-key rate limits, as one ASGI middleware in front of every route.

Owns: `AuthMiddleware`. With keys configured, every HTTP request but GET /health and /metrics
must carry `Authorization: Bearer <key>`; keys are compared in constant time
(`hmac.compare_digest` of SHA-256 digests, against every key, so timing tells neither a key,
its length, nor which one matched) and never logged: log lines name a key by its position
(`key#1`). Without keys the server is open and limits apply per client address.

Limits are token buckets refilled continuously (`requests_per_minute`, `tokens_per_minute`).
A request is admitted when its key has a request left and tokens for the request's estimate
(body bytes / 4 + max_tokens × n, the way hosted APIs charge before they know the output);
when it ends the charge is corrected to the `usage` the response reported (non-streaming
bodies, and streams with a usage chunk), so a bucket may go negative and later requests wait.
Refusals are 429 with Retry-After. Admission is the only check: an admitted request is never
cut. Errors are shaped for the surface the request belongs to (api/http/shared/errors.py).

Order, for every request: the key check (a request without a valid key gets its 401 whatever
the server's load), then load shedding (api/http/shared/admission.py), then the per-key limits
(which may read the body to estimate tokens), then the app. Imports trio, msgspec,
api.http.shared, api.http.platform and runtime.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import trio

from api.http.platform.config import PlatformConfig
from api.http.shared.admission import Admission
from api.http.shared.errors import ErrorShapes, HTTPError
from api.http.shared.routes import OPEN_PATHS, match
from runtime.logging import get_logger

log = get_logger("auth")

MAX_BUFFERED = 32 * 1024 * 1024  # as api.http.app.MAX_BODY_BYTES: Quart refuses larger bodies itself
BODY_TIMEOUT = 60.0
MAX_ACCOUNTS = 10_000


class TokenBucket:
    """`rate_per_minute` units, refilled continuously; may go negative after a correction."""

    def __init__(self, rate_per_minute: int, clock: Callable[[], float]) -> None:
        self.capacity = float(rate_per_minute)
        self.rate = rate_per_minute / 60.0
        self.level = self.capacity
        self._clock = clock
        self._stamp = clock()

    def _refill(self) -> None:
        now = self._clock()
        self.level = min(self.capacity, self.level + (now - self._stamp) * self.rate)
        self._stamp = now

    def wait_for(self, amount: float) -> float:
        """Seconds until `amount` (at most the capacity) is available; 0 when it is now."""
        self._refill()
        need = min(amount, self.capacity)
        return 0.0 if self.level >= need else (need - self.level) / self.rate

    def take(self, amount: float) -> None:
        self._refill()
        self.level -= amount

    def give_back(self, amount: float) -> None:
        self._refill()
        self.level = min(self.capacity, self.level + amount)


@dataclass(slots=True)
class Account:
    requests: TokenBucket | None
    tokens: TokenBucket | None


class RateLimiter:
    def __init__(self, config: PlatformConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.accounts: dict[str, Account] = {}

    @property
    def enabled(self) -> bool:
        return self.config.requests_per_minute is not None or self.config.tokens_per_minute is not None

    def account(self, who: str) -> Account:
        account = self.accounts.get(who)
        if account is None:
            if len(self.accounts) >= MAX_ACCOUNTS:
                self._forget_idle()
            rpm, tpm = self.config.requests_per_minute, self.config.tokens_per_minute
            account = self.accounts[who] = Account(
                TokenBucket(rpm, self.clock) if rpm else None, TokenBucket(tpm, self.clock) if tpm else None
            )
        return account

    def _forget_idle(self) -> None:
        """Drop accounts whose buckets are full again: they are as good as new (open servers
        keep one per client address, so the table must not grow without bound)."""
        for who, account in list(self.accounts.items()):
            buckets = [b for b in (account.requests, account.tokens) if b is not None]
            if all(b.wait_for(b.capacity) == 0 for b in buckets):
                del self.accounts[who]

    def admit(self, who: str, tokens: int) -> tuple[float, str]:
        """(0, "") and charge the account, or (seconds to wait, which limit) and charge nothing."""
        account = self.account(who)
        waits = []
        if account.requests is not None:
            waits.append((account.requests.wait_for(1), "requests"))
        if account.tokens is not None and tokens:
            waits.append((account.tokens.wait_for(tokens), "tokens"))
        wait, which = max(waits, default=(0.0, ""))
        if wait > 0:
            return wait, which
        if account.requests is not None:
            account.requests.take(1)
        if account.tokens is not None:
            account.tokens.take(tokens)
        return 0.0, ""

    def settle(self, who: str, charged: int, used: int) -> None:
        """Correct a charge to what the request really used."""
        bucket = self.account(who).tokens
        if bucket is None or used == charged:
            return
        if used < charged:
            bucket.give_back(charged - used)
        else:
            bucket.take(used - charged)


class AuthMiddleware:
    def __init__(
        self, app: Any, config: PlatformConfig, clock: Callable[[], float] = time.monotonic,
        admission: Admission | None = None, errors: ErrorShapes | None = None,
    ) -> None:
        self.app = app
        self.config = config
        self.admission = admission  # None: no load shedding here
        self.errors = errors  # the app's error shapes: refusals take the request's surface's
        # Digests, so every comparison is of 32 bytes: compare_digest's time then tells
        # neither a key's content nor its length.
        self._keys = [hashlib.sha256(key.encode()).digest() for key in config.api_keys]
        # A serve-ray replica passes the deployment's shared limiter (api/cluster/limits.py),
        # whose admit() is awaitable; one node keeps its own.
        self.limiter = config.rate_limiter or RateLimiter(config, clock)

    def identify(self, headers: list[tuple[bytes, bytes]]) -> int | None:
        """The index of the key the request carries, or None. Constant time in the key."""
        given = b""
        for name, value in headers:
            if name.lower() == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer":
                    given = token.strip()
                break
        digest = hashlib.sha256(given).digest()
        found = None
        for index, key in enumerate(self._keys):  # no early exit: every key is compared
            if hmac.compare_digest(digest, key) and given:
                found = index
        return found

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket") or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        who = None
        if self._keys:
            index = self.identify(scope.get("headers", []))
            if index is None:
                log.info("unauthorized", path=path, had_credentials=_has_auth_header(scope))
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                    return
                await self._reject(send, scope, 401, "Missing or invalid API key: send `Authorization: Bearer <key>`.")
                return
            who = f"key#{index + 1}"
        if scope["type"] == "http" and self.admission is not None:
            if self.admission.overloaded(scope):  # the access line records it (status 429)
                await self.admission.refuse(scope, receive, send)
                return
            with self.admission.entering(scope):
                await self._admitted(scope, receive, send, who)
            return
        await self._admitted(scope, receive, send, who)

    async def _admitted(self, scope: Any, receive: Any, send: Any, who: str | None) -> None:
        """Past the key check and load shedding: rate limits, then the app."""
        if not self.limiter.enabled or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        who = who or f"client:{(scope.get('client') or ('?',))[0]}"
        await self._limited(scope, receive, send, who)

    async def _reject(self, send: Any, scope: dict[str, Any], status: int, message: str, retry_after: float | None = None) -> None:
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
        if retry_after is not None:
            headers["Retry-After"] = str(max(1, math.ceil(retry_after)))
        assert self.errors is not None, "AuthMiddleware needs the app's error shapes to refuse"
        await self.errors.send(send, scope, HTTPError(status, message), headers)

    async def _limited(self, scope: dict[str, Any], receive: Any, send: Any, who: str) -> None:
        prompt = generate = 0
        replay = receive
        if self.limiter.config.tokens_per_minute and _runs_model(scope):  # its body is read up front to estimate tokens
            with trio.move_on_after(BODY_TIMEOUT) as timer:
                body, messages = await _read_body(receive)
            if timer.cancelled_caught:
                await self._reject(send, scope, 408, "The request body was not received in time.")
                return
            prompt, generate = estimate_tokens(body)
            replay = _replaying(messages, receive)
        estimate = prompt + generate
        decision = self.limiter.admit(who, estimate)
        wait, which = await decision if inspect.isawaitable(decision) else decision
        if wait > 0:
            log.info("rate_limited", key=who, limit=which, retry_after_s=round(wait, 3))
            limit = self.config.requests_per_minute if which == "requests" else self.config.tokens_per_minute
            whose = "this client address" if who.startswith("client:") else "this key"
            message = f"Rate limit of {limit} {which} per minute reached for {whose}; retry after {math.ceil(wait)}s."
            await self._reject(send, scope, 429, message, retry_after=wait)
            return
        if not estimate:
            await self.app(scope, replay, send)
            return
        meter = _UsageMeter()

        async def metered_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                meter.start(message)
            elif message["type"] == "http.response.body":
                meter.feed(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, replay, metered_send)
        finally:  # synchronous: this also runs when the client left and we are cancelled
            self.limiter.settle(who, estimate, meter.used(prompt, generate))


def _runs_model(scope: dict[str, Any]) -> bool:
    found = match(scope.get("method", ""), scope.get("path", ""))
    return found is not None and found[0].runs is not None


def _has_auth_header(scope: dict[str, Any]) -> bool:
    return any(name.lower() == b"authorization" for name, _ in scope.get("headers", []))


async def _read_body(receive: Any) -> tuple[bytes, list[dict[str, Any]]]:
    messages, size = [], 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        size += len(message.get("body", b""))
        if not message.get("more_body", False) or size > MAX_BUFFERED:
            break
    return b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request"), messages


def _replaying(messages: list[dict[str, Any]], receive: Any) -> Callable[[], Any]:
    pending = list(messages)

    async def replay() -> dict[str, Any]:
        if pending:
            return pending.pop(0)
        return await receive()  # the rest of the body, and http.disconnect

    return replay


def estimate_tokens(body: bytes) -> tuple[int, int]:
    """(prompt, generated) tokens a request is charged on admission: ~4 body bytes a token for
    the prompt, and max_tokens (× n) for the output when the request bounds it."""
    prompt = max(1, len(body) // 4)
    try:
        fields = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return prompt, 0
    if not isinstance(fields, dict):
        return prompt, 0
    generate = 0
    for name in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        value = fields.get(name)
        if isinstance(value, int) and value > 0:
            generate = value
            break
    n = fields.get("best_of") or fields.get("n") or 1
    n = n if isinstance(n, int) and 0 < n <= 128 else 1
    return prompt, generate * n


class _UsageMeter:
    """Finds `usage.total_tokens` in a response (a JSON body or an SSE usage chunk)."""

    def __init__(self) -> None:
        self.status = 0
        self.sse = False
        self.total: int | None = None
        self.events = 0
        self._json = bytearray()

    def start(self, message: dict[str, Any]) -> None:
        self.status = message["status"]
        for name, value in message.get("headers", ()):
            if name.lower() == b"content-type":
                self.sse = value.startswith(b"text/event-stream")

    def feed(self, chunk: bytes) -> None:
        if self.sse:
            self.events += chunk.count(b"data: ")
            if b'"total_tokens"' in chunk:
                for line in chunk.split(b"\n"):
                    if line.startswith(b"data: {"):
                        self._take(line[6:])
        elif len(self._json) < (1 << 20):
            self._json += chunk

    def _take(self, text: bytes | bytearray) -> None:
        try:
            body = msgspec.json.decode(text)
        except msgspec.DecodeError:
            return
        usage = body.get("usage") if isinstance(body, dict) else None
        if usage is None and isinstance(body, dict) and isinstance(body.get("response"), dict):
            usage = body["response"].get("usage")  # Responses API stream events
        if isinstance(usage, dict) and isinstance(usage.get("total_tokens"), int):
            self.total = usage["total_tokens"]

    def used(self, prompt: int, generate: int) -> int:
        if self.status >= 400 or self.status == 0:
            return 0  # refused or never answered: the model did no work worth charging
        if self.total is None and self._json:
            self._take(self._json)
        if self.total is not None:
            return self.total
        if self.events:  # a stream without a usage chunk: an event carries about one token
            return prompt + self.events
        return prompt + generate
