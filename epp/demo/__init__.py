"""`epp demo`: a pool, the picker and Envoy on loopback, driven and summarised, then stopped."""
