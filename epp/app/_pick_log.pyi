# The compiled pick log records (epp/app/_pick_log.c); epp.app.pick_log says when they run.
ENABLED: int

def write_record(
    block: object, at: int, seq: int, slot: int, token: int, shape: int, hashes: list[int], head: int
) -> None: ...
def read_records(
    block: object, base: int, capacity: int, record_words: int, start: int, head: int, max_hashes: int
) -> tuple[list[tuple[int, int, int, list[int]]], int]: ...
