"""Endpoint sources: where the pool's endpoints come from (a static list, or Kubernetes watches)."""
