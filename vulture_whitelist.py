# Names `make deadcode` (vulture) cannot see used; each group says who uses them. Not imported by anything:
# vulture only reads this file. Add a name here only for a use vulture cannot follow, never to hide unused code.
# ruff: noqa

# Callbacks the standard library calls: asyncio.Protocol and BufferedProtocol (epp/scrape/http.py,
# benchmarks/scrape.py) and http.server.BaseHTTPRequestHandler (test page servers).
_.connection_made
_.connection_lost
_.data_received
_.get_buffer
_.buffer_updated
_.do_GET
_.log_message

# Fields set on messages and arrays that their library reads: protobuf (Envoy config and ext_proc answers) and numpy
# array flags.
_.clear_body
_.lb_policy
_.response_header_mode
_.response_trailer_mode
_.allow_mode_override
_.writeable

# Parameters a caller's signature requires: signal handlers and context-manager exits; the C extension's
# arguments, named in the Protocol that types it (epp/kvevents/kernels.py, as epp/kvevents/_native.pyi; the pick
# log's, epp/app/pick_log.py, as epp/app/_pick_log.pyi).
record_words
max_hashes
signum
exc_type
table_keys
table_masks
max_probe

# Enum members unpacked by iteration (`... = Phase` in epp/extproc/stream.py).
REQUEST_HEADERS
REQUEST_BODY
REQUEST_PASS
RESPONSE_BODY
RESPONSE_DONE

# Fields that model an object as its source states it (InferencePool, FederatedCluster, EndpointPickerConfig's
# flowControl section, flow-control queue items and flow state), and result rows written out with dataclasses.asdict.
_.app_protocol
_.epp_service
_.gpus_total
_.nodes
_.observed_version
_.usage_limit_policy_ref
_.ticket
_.attained
_.attained_at
_.output_tok_s
ORDERING_TYPES
FAIRNESS_TYPES
USAGE_LIMIT_TYPES

# typing.Protocol classes: used in annotations only.
Admitter

# Statistics kept for operators and tests to read (feeder stats are read through SourceStats.__slots__).
_.reloads
_.skipped_events
_.replays
_.malformed_frames
_.stored_blocks
_.last_store_at
_.published_batches

# pytest and hypothesis: report fields, fixtures requested by name, state-machine hooks and generated test cases.
_.longrepr
envoy_available
_.teardown
TestRandomClusterEvents
test_stream_sequences

# The simulator's P/D counters: dataclass fields served as JSON by GET /sim/pd (dataclasses.asdict) and read by the
# P/D tests over HTTP.
_.prefills_served
_.prefill_requests
_.prefill_failures
_.remote_decodes
