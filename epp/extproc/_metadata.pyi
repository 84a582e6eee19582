# The compiled envoy.lb metadata (epp/extproc/_metadata.c); epp.extproc.messages says when it runs.
ENABLED: int

def lb_metadata(*fields: object) -> object: ...
