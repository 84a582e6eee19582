"""One set of TLS session-ticket keys for every serving worker of the native ext_proc front.

Envoy renews its connection to the picker now and then (`--epp-streams-per-connection`, the workers' GOAWAY) and
offers the session ticket it holds, so a reconnect is a resumption, not a full handshake (a certificate signature
and a key exchange, ~1 ms of the picker's CPU with the RSA-2048 default). A ticket is sealed with its server
context's ticket keys, and OpenSSL makes those at random per context: with several workers behind one port, a
reconnect the kernel hands to another worker could not open the ticket and made a full handshake (with 2 workers
about half of them). The control process therefore makes one set of keys and every worker installs it in its
context, so a ticket from any worker opens on every other.

Python's `ssl` has no call for it; OpenSSL does (`SSL_CTX_set_tlsext_ticket_keys`, a `SSL_CTX_ctrl` command). It is
reached through ctypes, in the libssl Python's own `_ssl` module is linked with, on the `SSL_CTX` behind the
`SSLContext` (the first field after the object header in CPython's `_ssl`). Each step is checked before the next:
CPython with the GIL, that libssl's version equal to the one `ssl` reports, the context's options and verify mode
read back through that pointer, the key length OpenSSL asks for, and the keys read back after setting them.
Anything else answers False and the context keeps its own keys: slower reconnects across workers, nothing worse.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import ssl
import sys
import sysconfig

log = logging.getLogger("epp.tls")

_SSL_CTRL_GET_TLSEXT_TICKET_KEYS = 58
_SSL_CTRL_SET_TLSEXT_TICKET_KEYS = 59
KEY_BYTES = 80  # OpenSSL 1.1.0 and later: 16 bytes of key name, 32 of HMAC key, 32 of AES key


def new_ticket_keys() -> bytes:
    """Fresh keys for one picker's workers (made once by the control process)."""
    return os.urandom(KEY_BYTES)


@functools.cache
def _libssl() -> ctypes.CDLL | None:
    """The libssl of Python's `_ssl` module, its three calls typed; None where it cannot be trusted."""
    if sys.implementation.name != "cpython" or sysconfig.get_config_var("Py_GIL_DISABLED"):
        return None
    if ssl.OPENSSL_VERSION_INFO < (1, 1, 1) or not ssl.OPENSSL_VERSION.startswith("OpenSSL"):
        return None  # LibreSSL and older OpenSSL lay out the keys otherwise
    import _ssl

    try:
        path = getattr(_ssl, "__file__", None)
        lib = ctypes.CDLL(path)  # None: built into the interpreter, its symbols in the process
        version = lib.OpenSSL_version_num
        ctrl = lib.SSL_CTX_ctrl
        get_options = lib.SSL_CTX_get_options
        get_verify_mode = lib.SSL_CTX_get_verify_mode
        clear = lib.ERR_clear_error
    except (OSError, AttributeError):
        return None
    version.restype, version.argtypes = ctypes.c_ulong, []
    if version() != ssl.OPENSSL_VERSION_NUMBER:
        return None  # another libssl than the one `ssl` was built against answered
    ctrl.restype, ctrl.argtypes = ctypes.c_long, [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_void_p]
    get_options.restype, get_options.argtypes = ctypes.c_uint64, [ctypes.c_void_p]
    get_verify_mode.restype, get_verify_mode.argtypes = ctypes.c_int, [ctypes.c_void_p]
    clear.restype, clear.argtypes = None, []
    return lib


def _ssl_ctx(lib: ctypes.CDLL, context: ssl.SSLContext) -> int | None:
    """The `SSL_CTX *` behind `context`, once what it points at reads back as `context`'s own settings."""
    offset = object.__basicsize__  # PySSLContext: PyObject_HEAD, then `SSL_CTX *ctx`
    if type(context).__basicsize__ < offset + ctypes.sizeof(ctypes.c_void_p):
        return None
    pointer = ctypes.c_void_p.from_address(id(context) + offset).value
    if not pointer:
        return None
    if lib.SSL_CTX_get_options(pointer) != int(context.options):
        return None
    if lib.SSL_CTX_get_verify_mode(pointer) != int(context.verify_mode):
        return None
    return pointer


def share_ticket_keys(context: ssl.SSLContext, keys: bytes) -> bool:
    """Seal and open this server context's session tickets with `keys`; False (the context's own keys kept) where
    this Python's ssl cannot be reached safely or OpenSSL refuses them."""
    if len(keys) != KEY_BYTES:
        raise ValueError(f"ticket keys are {KEY_BYTES} bytes, not {len(keys)}")
    lib = _libssl()
    pointer = None if lib is None else _ssl_ctx(lib, context)
    if lib is None or pointer is None:
        return False
    if lib.SSL_CTX_ctrl(pointer, _SSL_CTRL_GET_TLSEXT_TICKET_KEYS, 0, None) != KEY_BYTES:
        return False  # this OpenSSL wants another length (with no buffer, the command answers the length)
    given = ctypes.create_string_buffer(keys, KEY_BYTES)
    back = ctypes.create_string_buffer(KEY_BYTES)
    if (
        lib.SSL_CTX_ctrl(pointer, _SSL_CTRL_SET_TLSEXT_TICKET_KEYS, KEY_BYTES, given) != 1
        or lib.SSL_CTX_ctrl(pointer, _SSL_CTRL_GET_TLSEXT_TICKET_KEYS, KEY_BYTES, back) != 1
    ):
        lib.ERR_clear_error()  # OpenSSL's reason stays off the thread's error queue, where `ssl` would read it
        return False
    return back.raw == keys


__all__ = ["KEY_BYTES", "new_ticket_keys", "share_ticket_keys"]
