# The compiled header-map reader (epp/extproc/_headers.c); epp.extproc.messages says when it runs.
ENABLED: int

def header_dict(data: bytes) -> dict[str, str] | None: ...
