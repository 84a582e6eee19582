"""KV-cache events from the engines: the wire decoder, the block-key hasher, the index and the ZMQ feeder.

The pure parts (`decode`, `blockkeys`, `index`) do no I/O and read no clock; the feeder owns the sockets. This
package's `__init__` imports nothing so a decision-layer module can import the index without pulling in zmq.
"""
