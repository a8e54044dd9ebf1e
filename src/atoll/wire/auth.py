"""The run's shared secret, the metadata every call carries, the server-side check, and TLS.

The secret is read from a file or an environment variable (never a command-line argument, which
other users of the machine can read in the process list). Every call carries three metadata
entries: the run id, the secret and the protocol version. The server interceptor refuses a call
without a matching run id and secret (UNAUTHENTICATED) before any handler runs, and counts it.
"""

from __future__ import annotations

import hmac
import os
import threading
from collections.abc import Callable
from pathlib import Path

import grpc

from atoll.errors import ConfigError
from atoll.wire import PROTOCOL

RUN_KEY, TOKEN_KEY, PROTOCOL_KEY = "x-atoll-run", "x-atoll-token", "x-atoll-protocol"
SECRET_ENV = "ATOLL_SECRET"


def load_secret(secret_file: str | Path | None = None, env: str = SECRET_ENV) -> str:
    """The shared secret from `secret_file` if given, else from the environment variable."""
    if secret_file:
        path = Path(secret_file)
        if not path.is_file():
            raise ConfigError("secret_file", str(secret_file), "a readable file holding the secret")
        secret = path.read_text().strip()
    else:
        secret = os.environ.get(env, "").strip()
    if len(secret) < 8:
        raise ConfigError(
            "secret",
            "<hidden>" if secret else "<empty>",
            f"at least 8 characters, from --secret-file or the {env} environment variable",
        )
    return secret


def call_metadata(run_id: str, secret: str) -> tuple[tuple[str, str], ...]:
    return ((RUN_KEY, run_id), (TOKEN_KEY, secret), (PROTOCOL_KEY, str(PROTOCOL)))


class AuthInterceptor(grpc.ServerInterceptor):
    """Refuses calls whose run id, secret or protocol version do not match; counts them."""

    def __init__(
        self, run_id: str, secret: str, on_refused: Callable[[str, str], None] | None = None
    ) -> None:
        self.run_id, self.secret = run_id, secret
        self.on_refused = on_refused
        self.refused = 0
        self._lock = threading.Lock()

    def _reason(self, md: dict[str, str]) -> str | None:
        if not hmac.compare_digest(md.get(TOKEN_KEY, "").encode(), self.secret.encode()):
            return "missing or wrong shared secret"
        if md.get(RUN_KEY) != self.run_id:
            return f"run id {md.get(RUN_KEY)!r} is not this run's"
        if md.get(PROTOCOL_KEY) != str(PROTOCOL):
            return f"protocol {md.get(PROTOCOL_KEY)!r}, this syncer speaks {PROTOCOL}"
        return None

    def intercept_service(self, continuation, handler_call_details):  # noqa: ANN001, ANN201
        md = {k: v for k, v in (handler_call_details.invocation_metadata or ())}
        reason = self._reason(md)
        if reason is None:
            return continuation(handler_call_details)
        with self._lock:
            self.refused += 1
        if self.on_refused:
            self.on_refused(handler_call_details.method, reason)
        handler = continuation(handler_call_details)

        def deny(request_or_iterator, context):  # noqa: ANN001, ANN202
            context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)

        if handler is None:
            return None
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(deny)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(deny)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(deny)
        return grpc.unary_unary_rpc_method_handler(deny)


def server_credentials(cert: str | None, key: str | None) -> grpc.ServerCredentials | None:
    """TLS credentials from PEM files, or None for plaintext (both or neither must be given)."""
    if not cert and not key:
        return None
    if not (cert and key):
        raise ConfigError("tls", f"cert={cert}, key={key}", "both a certificate and a key file")
    return grpc.ssl_server_credentials([(Path(key).read_bytes(), Path(cert).read_bytes())])


# what both ends of a connection set (the syncer's server, a learner's channels): a keepalive
# ping every 10 s, calls or not, and messages up to 64 MiB each way
KEEPALIVE: list[tuple[str, object]] = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
]
MESSAGE_LIMITS: list[tuple[str, object]] = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]


def channel_options(name: str) -> list[tuple[str, object]]:
    """Keepalives, message limits, and a distinct option per channel so that the control and the
    bulk channel never share one TCP connection (control traffic stays off the bulk path)."""
    return [
        *KEEPALIVE,
        ("grpc.http2.max_pings_without_data", 0),
        *MESSAGE_LIMITS,
        ("grpc.enable_retries", 0),
        # a syncer that restarts is back within seconds: try its address again at most every
        # 2 s (grpc's default backoff grows to 120 s, and a learner could miss the syncer's
        # return for a whole run)
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.min_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 2000),
        ("atoll.channel", name),
        ("grpc.use_local_subchannel_pool", 1),
        # a server stream (Join) is read by the thread that iterates it, without waking a
        # separate polling thread for every message
        ("SingleThreadedUnaryStream", 1),
    ]


def open_channel(address: str, name: str, tls_ca: str | None = None) -> grpc.Channel:
    opts = channel_options(name)
    if tls_ca:
        creds = grpc.ssl_channel_credentials(root_certificates=Path(tls_ca).read_bytes())
        return grpc.secure_channel(address, creds, options=opts)
    return grpc.insecure_channel(address, options=opts)
