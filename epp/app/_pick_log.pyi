# The compiled pick log records and in-flight sums (epp/app/_pick_log.c); epp.app.pick_log says when they run.
ENABLED: int

def append_record(
    ring: tuple[object, int, int, int, int], position: int, slot: int, token: int, hashes: list[int]
) -> None: ...
def read_rings(
    block: object, workers: int, capacity: int, record_words: int, me: int, next: list[int]
) -> tuple[list[tuple[int, int, int, list[int]]], int]: ...
def sum_cells(
    cells: object,
    end: int,
    stride: int,
    pairs: list[tuple[int, int]],
    inflight: object,
    picks: object,
    tokens: object,
) -> None: ...
def book_cells(cells: object, base: int, control_of: list[int], slot: int, tokens: int) -> None: ...
def release_cells(cells: object, base: int, control_of: list[int], slot: int, tokens: int) -> None: ...
