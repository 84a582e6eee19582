"""Lines written to stderr outside `logging` (gRPC core's C++ logging, tracebacks) become JSON records in the log's
own format under `--zap-encoder json`; lines that are JSON objects already pass as they are."""

import json

from epp.observability.logs import JsonLineFormatter
from epp.observability.stderr_json import json_line

GRPC = b"E1201 12:00:00.123456   4242 ssl_transport_security.cc:3238] No match found for server name: epp\n"


def test_a_grpc_core_line_becomes_an_error_record_with_its_caller() -> None:
    record = json.loads(json_line(GRPC, 1.5, JsonLineFormatter("epoch")))
    assert record == {
        "ts": 1.5,
        "level": "error",
        "logger": "grpc",
        "msg": "No match found for server name: epp",
        "caller": "ssl_transport_security.cc:3238",
    }


def test_grpc_core_levels_are_kept() -> None:
    warning = b"W1201 12:00:00.123456 1 chttp2_server.cc:1050] Handshake failed\n"
    assert json.loads(json_line(warning, 0.0, JsonLineFormatter()))["level"] == "warn"


def test_any_other_line_is_an_error_record_and_a_json_object_passes_unchanged() -> None:
    formatter = JsonLineFormatter()
    record = json.loads(json_line(b"Traceback (most recent call last):\n", 0.0, formatter))
    assert record["logger"] == "stderr" and record["level"] == "error"
    assert record["msg"] == "Traceback (most recent call last):"
    already = b'{"ts":"x","level":"info","logger":"epp","msg":"serving"}'
    assert json_line(already + b"\n", 0.0, formatter) == already + b"\n"
    assert json.loads(json_line(b"[1, 2]\n", 0.0, formatter))["msg"] == "[1, 2]"  # JSON, but not a record
