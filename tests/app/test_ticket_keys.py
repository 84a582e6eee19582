"""Session-ticket keys shared by the serving workers: a session one worker's context made resumes on another's."""

from __future__ import annotations

import ssl

import pytest

from epp.app.ticket_keys import KEY_BYTES, new_ticket_keys, share_ticket_keys
from epp.app.tls import TlsSettings, self_signed_pair, server_context

PAIR = self_signed_pair()


def _client() -> ssl.SSLContext:
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    client.set_alpn_protocols(["h2"])
    return client


def _connect(server: ssl.SSLContext, client: ssl.SSLContext, session: ssl.SSLSession | None) -> ssl.SSLObject:
    """A handshake over memory BIOs, then one answer from the server (TLS 1.3 sends its tickets after the
    handshake): the client's side, its session ready to offer next time."""
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    near = client.wrap_bio(c_in, c_out, server_hostname="localhost", session=session)
    far = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"near": False, "far": False}
    for _ in range(20):
        for name, side in (("near", near), ("far", far)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if done["near"] and done["far"]:
            break
    assert done == {"near": True, "far": True}
    far.write(b"ok")
    c_in.write(s_out.read())
    assert near.read(2) == b"ok"
    return near


def _worker_context(keys: bytes | None) -> ssl.SSLContext:
    return server_context(TlsSettings(self_signed=PAIR, ticket_keys=keys))


def test_a_session_made_by_one_worker_resumes_on_another_with_the_shared_keys() -> None:
    keys = new_ticket_keys()
    first, second, client = _worker_context(keys), _worker_context(keys), _client()
    made = _connect(first, client, None)
    assert not made.session_reused
    again = _connect(second, client, made.session)
    assert again.session_reused
    assert again.version() == made.version()


def test_without_shared_keys_another_workers_context_cannot_resume_the_session() -> None:
    first, second, client = _worker_context(None), _worker_context(None), _client()
    made = _connect(first, client, None)
    assert _connect(first, client, made.session).session_reused  # its own context resumes it
    assert not _connect(second, client, made.session).session_reused


def test_sharing_is_refused_for_keys_of_the_wrong_length() -> None:
    with pytest.raises(ValueError, match=f"{KEY_BYTES} bytes"):
        share_ticket_keys(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), b"short")


def test_a_context_the_keys_cannot_be_read_back_through_is_left_alone() -> None:
    class Odd(ssl.SSLContext):
        """A context whose options do not read back through the pointer (as a foreign layout would look)."""

        @property
        def options(self) -> ssl.Options:  # type: ignore[override]
            return ssl.Options(int(super().options) ^ int(ssl.OP_NO_TICKET))

    assert not share_ticket_keys(Odd(ssl.PROTOCOL_TLS_SERVER), new_ticket_keys())
