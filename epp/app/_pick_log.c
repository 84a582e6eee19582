/* The serving workers' shared blocks: the pick log, a record at a time (epp/app/pick_log.py's
 * `PickLog.append_python` and `PickLog.read_python`, step for step): one call per record written and one per read of
 * every other ring, where the Python code costs an array, a slice and a handful of memoryview index operations per
 * record; the in-flight matrix's sums of a small pool (epp/app/mirror_table.py's `MirrorTable._sum_cells`); and a
 * pick's booking and release in our row of that matrix (`MirrorTable.book_cells_python`, `release_cells_python`).
 *
 * The block is int64 words (a writable buffer: the memfd's mapping). A record at word `at`: stamp, control slot,
 * token, scorer position << 16 | hash count, then the hashes (unsigned 64-bit). The writer stamps it -(seq + 1)
 * before the payload and seq + 1 after it (release stores); a reader copies the header and the hashes and keeps the
 * record only if the stamp it read before and after is seq + 1 (acquire loads). */
#include "../optional_module.h"

#include <stdint.h>

#define MAX_WORDS 256 /* pick_log.MAX_HASHES: the caller bounds `count`; more is refused before a write */

/* `v` as an unsigned 64-bit word, or -1 with OverflowError (negative, or 2**64 and more) or TypeError set, as
 * PyLong_AsUnsignedLongLong (what the array the Python code builds calls). On CPython 3.11 an exact int is read
 * from its 30-bit digits: ~10 instructions, where PyLong_AsUnsignedLongLong's byte-array conversion takes ~170 (a
 * record's 11 hashes: ~1.9k of a ~2.6k write). Elsewhere the general call. */
static inline int
hash_word(PyObject *v, uint64_t *out)
{
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000 && PyLong_SHIFT == 30
    if (PyLong_CheckExact(v)) {
        Py_ssize_t size = Py_SIZE(v);
        const digit *d = ((PyLongObject *)v)->ob_digit;
        if (size >= 0 && size <= 3 && (size < 3 || d[2] < 16)) { /* 0 <= v < 2**64: at most 30 + 30 + 4 bits */
            uint64_t x = 0;
            while (size > 0) {
                size--;
                x = x << 30 | d[size];
            }
            *out = x;
            return 0;
        }
    }
#endif
    uint64_t x = PyLong_AsUnsignedLongLong(v);
    if (x == (uint64_t)-1 && PyErr_Occurred())
        return -1;
    *out = x;
    return 0;
}

static int
words_of(PyObject *obj, Py_buffer *view, int writable)
{
    if (PyObject_GetBuffer(obj, view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0)
        return -1;
    if (view->len % 8) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "the pick log's block is int64 words");
        return -1;
    }
    return 0;
}

/* The ring layout every call is given (pick_log.py's constants): `workers` heads, then `workers` rings of `capacity`
 * records of `record_words` words, of which at most `record_words` - 4 hashes. */
typedef struct {
    Py_ssize_t workers, capacity, record_words, max_hashes;
} layout;

static int
layout_of(PyObject *const *args, layout *out)
{
    out->workers = PyLong_AsSsize_t(args[0]);
    out->capacity = PyLong_AsSsize_t(args[1]);
    out->record_words = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred())
        return -1;
    out->max_hashes = out->record_words - 4;
    if (out->workers <= 0 || out->capacity <= 0 || out->max_hashes < 0 || out->max_hashes > MAX_WORDS) {
        PyErr_SetString(PyExc_ValueError, "the pick log: not a layout of rings");
        return -1;
    }
    return 0;
}

/* The word offset of ring `worker`'s record `seq` (pick_log.py's `_record`; Python's modulo). */
static inline Py_ssize_t
record_at(const layout *l, Py_ssize_t worker, long long seq)
{
    long long r = seq % l->capacity;
    if (r < 0)
        r += l->capacity;
    return l->workers + (worker * l->capacity + (Py_ssize_t)r) * l->record_words;
}

/* append_record(ring, position, slot, token, hashes) -> None, `ring` = (block, workers, capacity, record_words, me)
 *
 * pick_log.py's `PickLog.append_python`: record (ring `me`'s head) in ring `me` with its header and the first
 * `record_words` - 4 of `hashes` (a list of ints in [0, 2**64)), then the head = its number + 1. A hash out of
 * range raises OverflowError before anything is written (as the array the Python code builds does). Called through
 * a `functools.partial` of `ring` (`PickLog.append`): one C call per pick, no Python frame, and the partial's 5
 * arguments fit its stack (9 would be a malloc and a free per call). */
static PyObject *
append_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 5 || !PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) != 5 || !PyList_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "append_record takes (block, workers, capacity, record_words, me), "
                                         "position, slot, token, hashes");
        return NULL;
    }
    PyObject *const *ring = &PyTuple_GET_ITEM(args[0], 0);
    layout l;
    if (layout_of(ring + 1, &l) < 0)
        return NULL;
    Py_ssize_t me = PyLong_AsSsize_t(ring[4]);
    long long position = PyLong_AsLongLong(args[1]), slot = PyLong_AsLongLong(args[2]);
    long long token = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    PyObject *hashes = args[4];
    Py_ssize_t count = PyList_GET_SIZE(hashes);
    if (count > l.max_hashes)
        count = l.max_hashes;
    uint64_t values[MAX_WORDS];
    for (Py_ssize_t i = 0; i < count; i++) {
        if (hash_word(PyList_GET_ITEM(hashes, i), &values[i]) < 0)
            return NULL;
    }
    Py_buffer view;
    if (words_of(ring[0], &view, 1) < 0)
        return NULL;
    int64_t *words = (int64_t *)view.buf;
    Py_ssize_t n = view.len / 8;
    if (me < 0 || me >= l.workers || l.workers + l.workers * l.capacity * l.record_words > n) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_IndexError, "append_record: outside the block");
        return NULL;
    }
    long long seq = __atomic_load_n(&words[me], __ATOMIC_RELAXED); /* ours: no other writer */
    Py_ssize_t at = record_at(&l, me, seq);
    __atomic_store_n(&words[at], (int64_t)-(seq + 1), __ATOMIC_RELEASE); /* being written */
    words[at + 1] = slot;
    words[at + 2] = token;
    words[at + 3] = position << 16 | count;
    memcpy(&words[at + 4], values, (size_t)count * 8);
    __atomic_store_n(&words[at], (int64_t)(seq + 1), __ATOMIC_RELEASE); /* whole */
    __atomic_store_n(&words[me], (int64_t)(seq + 1), __ATOMIC_RELEASE);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

/* One record as read_python yields it: (scorer position, control slot, token, hashes). */
static PyObject *
record_tuple(int64_t shape, int64_t slot, int64_t token, PyObject *list)
{
    PyObject *item = PyTuple_New(4);
    if (item == NULL)
        return NULL;
    PyObject *a = PyLong_FromLongLong((long long)(shape >> 16)), *b = PyLong_FromLongLong((long long)slot);
    PyObject *c = PyLong_FromLongLong((long long)token);
    if (a == NULL || b == NULL || c == NULL) {
        Py_XDECREF(a);
        Py_XDECREF(b);
        Py_XDECREF(c);
        Py_DECREF(item);
        return NULL;
    }
    Py_INCREF(list);
    PyTuple_SET_ITEM(item, 0, a);
    PyTuple_SET_ITEM(item, 1, b);
    PyTuple_SET_ITEM(item, 2, c);
    PyTuple_SET_ITEM(item, 3, list);
    return item;
}

/* read_rings(block, workers, capacity, record_words, me, next) -> (records, lost)
 *
 * pick_log.py's `PickLog.read_python` over every ring but `me`'s (-1: every ring): `next[w]` is where this reader
 * stopped in ring w (`_unread_from`: from 0 when the ring's head is behind it, never more than a ring back, what a
 * writer lapped counted in `lost`), set to the ring's head once read. Each whole record as (scorer position,
 * control slot, token, hashes as a list of ints); `lost` also counts those overwritten while read. A record whose
 * hashes equal the last kept one's gets that one's list (a repeated prompt: one list, not a list and a dozen ints
 * each; every learner only reads it). */
static PyObject *
read_rings(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 6 || !PyList_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "read_rings takes block, workers, capacity, record_words, me, next");
        return NULL;
    }
    layout l;
    if (layout_of(args + 1, &l) < 0)
        return NULL;
    Py_ssize_t me = PyLong_AsSsize_t(args[4]);
    if (me == -1 && PyErr_Occurred())
        return NULL;
    PyObject *next = args[5];
    if (PyList_GET_SIZE(next) != l.workers) {
        PyErr_SetString(PyExc_ValueError, "read_rings: a start per ring");
        return NULL;
    }
    for (Py_ssize_t w = 0; w < l.workers; w++) { /* every start an int before anything moves */
        if (!PyLong_Check(PyList_GET_ITEM(next, w))) {
            PyErr_SetString(PyExc_TypeError, "read_rings: the starts are ints");
            return NULL;
        }
    }
    Py_buffer view;
    if (words_of(args[0], &view, 0) < 0)
        return NULL;
    const int64_t *words = (const int64_t *)view.buf;
    if (l.workers + l.workers * l.capacity * l.record_words > view.len / 8) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_IndexError, "read_rings: outside the block");
        return NULL;
    }
    PyObject *records = PyList_New(0), *last = NULL; /* `last`: the last kept record's hashes (borrowed) */
    Py_ssize_t last_count = 0;
    long long lost = 0;
    uint64_t values[MAX_WORDS], kept[MAX_WORDS];
    if (records == NULL)
        goto fail;
    for (Py_ssize_t worker = 0; worker < l.workers; worker++) {
        if (worker == me)
            continue;
        long long head = __atomic_load_n(&words[worker], __ATOMIC_ACQUIRE);
        long long start = PyLong_AsLongLong(PyList_GET_ITEM(next, worker));
        if (start == -1 && PyErr_Occurred())
            goto fail;
        if (head < start)
            start = 0;
        if (head - start > l.capacity) {
            lost += head - start - l.capacity;
            start = head - l.capacity;
        }
        for (long long seq = start; seq < head; seq++) {
            const int64_t *record = words + record_at(&l, worker, seq);
            int64_t stamp = __atomic_load_n(&record[0], __ATOMIC_ACQUIRE);
            int64_t slot = record[1], token = record[2], shape = record[3];
            Py_ssize_t count = (Py_ssize_t)(shape & 0xFFFF);
            if (count > l.max_hashes)
                count = l.max_hashes;
            memcpy(values, &record[4], (size_t)count * 8);
            __atomic_thread_fence(__ATOMIC_ACQUIRE);
            if (stamp != seq + 1 || __atomic_load_n(&record[0], __ATOMIC_ACQUIRE) != seq + 1) {
                lost++; /* overwritten while we read */
                continue;
            }
            PyObject *list;
            if (last != NULL && count == last_count && memcmp(values, kept, (size_t)count * 8) == 0) {
                list = last;
                Py_INCREF(list);
            } else {
                list = PyList_New(count);
                if (list == NULL)
                    goto fail;
                for (Py_ssize_t i = 0; i < count; i++) {
                    PyObject *value = PyLong_FromUnsignedLongLong(values[i]);
                    if (value == NULL) {
                        Py_DECREF(list);
                        goto fail;
                    }
                    PyList_SET_ITEM(list, i, value);
                }
                memcpy(kept, values, (size_t)count * 8);
                last_count = count;
            }
            PyObject *item = record_tuple(shape, slot, token, list);
            Py_DECREF(list);
            if (item == NULL)
                goto fail;
            int rc = PyList_Append(records, item);
            Py_DECREF(item);
            if (rc < 0)
                goto fail;
            last = list; /* held by the record in `records` */
        }
        PyObject *moved = PyLong_FromLongLong(head);
        if (moved == NULL)
            goto fail;
        PyList_SetItem(next, worker, moved); /* steals `moved` */
    }
    PyBuffer_Release(&view);
    PyObject *taken = PyTuple_New(2), *count_lost = PyLong_FromLongLong(lost);
    if (taken == NULL || count_lost == NULL) {
        Py_XDECREF(taken);
        Py_XDECREF(count_lost);
        Py_DECREF(records);
        return NULL;
    }
    PyTuple_SET_ITEM(taken, 0, records);
    PyTuple_SET_ITEM(taken, 1, count_lost);
    return taken;
fail:
    Py_XDECREF(records);
    PyBuffer_Release(&view);
    return NULL;
}

static int
int64_view(PyObject *obj, Py_buffer *view, int writable, Py_ssize_t *n)
{
    if (words_of(obj, view, writable) < 0)
        return -1;
    *n = view->len / 8;
    return 0;
}

/* sum_cells(cells, end, stride, pairs, inflight, picks, tokens) -> None
 *
 * epp/app/mirror_table.py's `MirrorTable._sum_cells` (a small pool's refresh): for each (our slot, first cell) of
 * `pairs`, the in-flight matrix's three cells summed over every worker's row (`cells` int64 words, a row every
 * `stride`, `end` words of rows), into our slot of the table's three int rows (int64 buffers). One call, where the
 * Python loop costs ~15k instructions for 2 endpoints of 2 workers. */
static PyObject *
sum_cells(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 7 || !PyList_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "sum_cells takes cells, end, stride, pairs, inflight, picks, tokens");
        return NULL;
    }
    Py_ssize_t end = PyLong_AsSsize_t(args[1]), stride = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred())
        return NULL;
    if (stride <= 0 || end < 0) {
        PyErr_SetString(PyExc_ValueError, "sum_cells: not a matrix");
        return NULL;
    }
    Py_buffer views[4];
    Py_ssize_t sizes[4];
    int held = 0;
    for (; held < 4; held++) {
        if (int64_view(args[held == 0 ? 0 : held + 3], &views[held], held > 0, &sizes[held]) < 0)
            goto fail;
    }
    const int64_t *cells = (const int64_t *)views[0].buf;
    int64_t *inflight = (int64_t *)views[1].buf, *picks = (int64_t *)views[2].buf, *tokens = (int64_t *)views[3].buf;
    PyObject *pairs = args[3];
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(pairs); i++) {
        PyObject *pair = PyList_GET_ITEM(pairs, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "sum_cells: pairs of (our slot, first cell)");
            goto fail;
        }
        Py_ssize_t ours = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 0));
        Py_ssize_t first = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 1));
        if (PyErr_Occurred())
            goto fail;
        Py_ssize_t last = end > 0 ? first + (end - 1) / stride * stride : first; /* range(first, first + end, stride) */
        if (ours < 0 || first < 0 || ours >= sizes[1] || ours >= sizes[2] || ours >= sizes[3] ||
            (end > 0 && last + 2 >= sizes[0])) {
            PyErr_SetString(PyExc_IndexError, "sum_cells: outside the matrix or the table");
            goto fail;
        }
        int64_t n_flight = 0, n_picks = 0, n_tokens = 0;
        for (Py_ssize_t at = first; at < first + end; at += stride) {
            n_flight += cells[at]; /* INFLIGHT, PICKS, TOKENS: the record's three cells in order */
            n_picks += cells[at + 1];
            n_tokens += cells[at + 2];
        }
        inflight[ours] = n_flight;
        picks[ours] = n_picks;
        tokens[ours] = n_tokens;
    }
    for (int k = 0; k < held; k++)
        PyBuffer_Release(&views[k]);
    Py_RETURN_NONE;
fail:
    for (int k = 0; k < held; k++)
        PyBuffer_Release(&views[k]);
    return NULL;
}

/* book_cells(cells, base, control_of, slot, tokens) / release_cells(...) -> None
 *
 * epp/app/mirror_table.py's `MirrorTable.book_cells_python` and `release_cells_python`, step for step: our slot
 * `slot`'s control slot (`control_of`, a list of ints; -1 or out of the list: none, nothing written) names the
 * record at `base` + 3 * control in `cells` (int64 words); a booking adds 1 to its INFLIGHT and PICKS cells and
 * `tokens` to TOKENS, a release takes 1 and `tokens` away, neither below 0. Called through a `functools.partial`
 * of (cells, base, control_of), remade with each membership: one C call per booking, where the Python code costs
 * ~6k instructions (memoryview reads and writes, two `max` calls). */
static PyObject *
cells_change(PyObject *const *args, Py_ssize_t nargs, int book)
{
    if (nargs != 5 || !PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "book_cells and release_cells take cells, base, control_of, slot, tokens");
        return NULL;
    }
    Py_ssize_t base = PyLong_AsSsize_t(args[1]), slot = PyLong_AsSsize_t(args[3]);
    long long tokens = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    PyObject *control_of = args[2];
    if (slot < 0 || slot >= PyList_GET_SIZE(control_of))
        Py_RETURN_NONE;
    Py_ssize_t control = PyLong_AsSsize_t(PyList_GET_ITEM(control_of, slot));
    if (control == -1 && PyErr_Occurred())
        return NULL;
    if (control < 0)
        Py_RETURN_NONE;
    Py_buffer view;
    Py_ssize_t n;
    if (int64_view(args[0], &view, 1, &n) < 0)
        return NULL;
    Py_ssize_t at = base + control * 3;
    if (base < 0 || at + 2 >= n) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_IndexError, "book_cells: outside the matrix");
        return NULL;
    }
    int64_t *cells = (int64_t *)view.buf;
    if (book) {
        cells[at] += 1; /* INFLIGHT, PICKS, TOKENS */
        cells[at + 1] += 1;
        if (tokens)
            cells[at + 2] += tokens;
    } else {
        cells[at] = cells[at] - 1 > 0 ? cells[at] - 1 : 0;
        if (tokens)
            cells[at + 2] = cells[at + 2] - tokens > 0 ? cells[at + 2] - tokens : 0;
    }
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static PyObject *
book_cells(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    return cells_change(args, nargs, 1);
}

static PyObject *
release_cells(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    return cells_change(args, nargs, 0);
}

static PyMethodDef methods[] = {
    {"append_record", (PyCFunction)(void (*)(void))append_record, METH_FASTCALL,
     "One record of ours into our ring, then its head (pick_log.py's PickLog.append_python)."},
    {"read_rings", (PyCFunction)(void (*)(void))read_rings, METH_FASTCALL,
     "The whole records of the other rings since the last read, and how many were lost (pick_log.py's read_python)."},
    {"sum_cells", (PyCFunction)(void (*)(void))sum_cells, METH_FASTCALL,
     "A small pool's in-flight sums into the table's rows (mirror_table.py's MirrorTable._sum_cells)."},
    {"book_cells", (PyCFunction)(void (*)(void))book_cells, METH_FASTCALL,
     "A pick booked in our row of the in-flight matrix (mirror_table.py's MirrorTable.book_cells_python)."},
    {"release_cells", (PyCFunction)(void (*)(void))release_cells, METH_FASTCALL,
     "A pick released from our row of the in-flight matrix (mirror_table.py's MirrorTable.release_cells_python)."},
    {NULL, NULL, 0, NULL},
};

EPP_OPTIONAL_MODULE(PyInit__pick_log, "epp.app._pick_log",
                    "The serving workers' pick log and in-flight sums (see pick_log.py, mirror_table.py).", methods, NULL)
