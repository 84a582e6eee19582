"""Through the real ext_proc stream: a remote pick sets the site's gateway as destination and adds the hop marker."""

import json

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from prometheus_client import CollectorRegistry

from epp.extproc.stream import StreamSettings
from epp.observability.metrics import PickerMetrics
from tests.extproc.envoy import DecidingStream
from tests.federation.builders import director, local_table, registry, router, site


def test_remote_pick_sets_destination_metadata_and_hop_header() -> None:
    sites = registry(site("dc", "dc", 1))
    d = director(local_table(1, waiting=50), router(sites, "eu"))
    stream = DecidingStream(d, PickerMetrics(CollectorRegistry()), lambda: 0.0, StreamSettings(max_body_bytes=1 << 20))
    values = {":method": "POST", ":path": "/v1/completions", "x-request-id": "r1"}
    header_map = base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()]
    )
    stream.handle(pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=header_map)))
    body = json.dumps({"model": "llama", "prompt": "hi"}).encode()
    out = stream.handle(pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)))
    common = out[0].request_body.response  # buffered mode: the decision rides on the body response
    set_headers = {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers}
    assert set_headers["x-gateway-destination-endpoint"] == "127.20.0.1:8080"
    assert set_headers["x-epp-federated-from"] == "eu"
    metadata = out[0].dynamic_metadata.fields["envoy.lb"].struct_value.fields["x-gateway-destination-endpoint"]
    assert metadata.string_value == "127.20.0.1:8080"
    assert sites.inflight("dc") == 1
    stream.close()
    assert sites.inflight("dc") == 0
