"""Federation across LLMKube sites (docs/federation.md): `phase` recomputes a FederatedCluster's phase from its
heartbeat, `policy` decides residency and overflow per request (pure), `watch` folds FederatedCluster objects into
the sites registry (epp.datastore.sites)."""
