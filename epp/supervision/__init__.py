"""The child-process kit: one way to spawn, talk to, supervise and stop a child process (epp.supervision.child,
the parent's side; epp.supervision.child_end, the child's), with memfd shared memory (epp.supervision.memory) and
one backoff (epp.supervision.backoff). In the support layer, so a feeder (epp.scrape) and the composition root
(epp.app) use the same kit."""
