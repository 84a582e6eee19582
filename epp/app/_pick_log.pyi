# The compiled pick log records (epp/app/_pick_log.c); epp.app.pick_log says when they run.
ENABLED: int

def append_record(
    block: object,
    workers: int,
    capacity: int,
    record_words: int,
    me: int,
    position: int,
    slot: int,
    token: int,
    hashes: list[int],
) -> None: ...
def read_rings(
    block: object, workers: int, capacity: int, record_words: int, me: int, next: list[int]
) -> tuple[list[tuple[int, int, int, list[int]]], int]: ...
