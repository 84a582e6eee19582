"""Kubernetes feeders: the generic list/watch helper, pool and pod discovery, objectives, leader election."""
