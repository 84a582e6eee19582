/* The serving workers' pick log, a record at a time (epp/app/pick_log.py's `PickLog.append_python` and
 * `PickLog.read_python`, step for step): one call per record written and one per ring read, where the Python code
 * costs an array, a slice and a handful of memoryview index operations per record.
 *
 * The block is int64 words (a writable buffer: the memfd's mapping). A record at word `at`: stamp, control slot,
 * token, scorer position << 16 | hash count, then the hashes (unsigned 64-bit). The writer stamps it -(seq + 1)
 * before the payload and seq + 1 after it (release stores); a reader copies the header and the hashes and keeps the
 * record only if the stamp it read before and after is seq + 1 (acquire loads). */
#include "../optional_module.h"

#include <stdint.h>

#define MAX_WORDS 256 /* pick_log.MAX_HASHES: the caller bounds `count`; more is refused before a write */

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

/* write_record(block, at, seq, slot, token, shape, hashes, head) -> None
 *
 * Record `seq` at word `at` with its header and the first `shape & 0xFFFF` of `hashes` (a list of ints in
 * [0, 2**64)), then the ring's head (word `head`) = seq + 1. A hash out of range raises OverflowError before
 * anything is written (as the array the Python code builds does). */
static PyObject *
write_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 8 || !PyList_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError, "write_record takes block, at, seq, slot, token, shape, hashes, head");
        return NULL;
    }
    Py_ssize_t at = PyLong_AsSsize_t(args[1]), head = PyLong_AsSsize_t(args[7]);
    long long seq = PyLong_AsLongLong(args[2]), slot = PyLong_AsLongLong(args[3]);
    long long token = PyLong_AsLongLong(args[4]), shape = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred())
        return NULL;
    PyObject *hashes = args[6];
    Py_ssize_t count = (Py_ssize_t)(shape & 0xFFFF);
    if (count > MAX_WORDS || count > PyList_GET_SIZE(hashes)) {
        PyErr_SetString(PyExc_ValueError, "write_record: more hashes than the record or the list holds");
        return NULL;
    }
    uint64_t values[MAX_WORDS];
    for (Py_ssize_t i = 0; i < count; i++) {
        values[i] = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(hashes, i));
        if (values[i] == (uint64_t)-1 && PyErr_Occurred())
            return NULL;
    }
    Py_buffer view;
    if (words_of(args[0], &view, 1) < 0)
        return NULL;
    int64_t *words = (int64_t *)view.buf;
    Py_ssize_t n = view.len / 8;
    if (at < 0 || head < 0 || at + 4 + count > n || head >= n) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_IndexError, "write_record: outside the block");
        return NULL;
    }
    __atomic_store_n(&words[at], (int64_t)-(seq + 1), __ATOMIC_RELEASE); /* being written */
    words[at + 1] = slot;
    words[at + 2] = token;
    words[at + 3] = shape;
    memcpy(&words[at + 4], values, (size_t)count * 8);
    __atomic_store_n(&words[at], (int64_t)(seq + 1), __ATOMIC_RELEASE); /* whole */
    __atomic_store_n(&words[head], (int64_t)(seq + 1), __ATOMIC_RELEASE);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

/* read_records(block, base, capacity, record_words, start, head, max_hashes) -> (records, lost)
 *
 * Records `start` … `head` - 1 of the ring at word `base` (`capacity` records of `record_words` words): each whole
 * one as (scorer position, control slot, token, hashes as a list of ints); `lost` counts those overwritten while
 * read. */
static PyObject *
read_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "read_records takes block, base, capacity, record_words, start, head, max_hashes");
        return NULL;
    }
    Py_ssize_t base = PyLong_AsSsize_t(args[1]), capacity = PyLong_AsSsize_t(args[2]);
    Py_ssize_t record_words = PyLong_AsSsize_t(args[3]), max_hashes = PyLong_AsSsize_t(args[6]);
    long long start = PyLong_AsLongLong(args[4]), head = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred())
        return NULL;
    if (capacity <= 0 || max_hashes < 0 || max_hashes > MAX_WORDS || record_words < 4 + max_hashes || start < 0) {
        PyErr_SetString(PyExc_ValueError, "read_records: not a ring of records");
        return NULL;
    }
    Py_buffer view;
    if (words_of(args[0], &view, 0) < 0)
        return NULL;
    const int64_t *words = (const int64_t *)view.buf;
    if (base < 0 || base + capacity * record_words > view.len / 8) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_IndexError, "read_records: outside the block");
        return NULL;
    }
    PyObject *records = PyList_New(0);
    long long lost = 0;
    uint64_t values[MAX_WORDS];
    if (records == NULL)
        goto fail;
    for (long long seq = start; seq < head; seq++) {
        const int64_t *record = words + base + (Py_ssize_t)(seq % capacity) * record_words;
        int64_t stamp = __atomic_load_n(&record[0], __ATOMIC_ACQUIRE);
        int64_t slot = record[1], token = record[2], shape = record[3];
        Py_ssize_t count = (Py_ssize_t)(shape & 0xFFFF);
        if (count > max_hashes)
            count = max_hashes;
        if (count < 0)
            count = 0;
        memcpy(values, &record[4], (size_t)count * 8);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (stamp != seq + 1 || __atomic_load_n(&record[0], __ATOMIC_ACQUIRE) != seq + 1) {
            lost++; /* overwritten while we read */
            continue;
        }
        PyObject *list = PyList_New(count);
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
        PyObject *item = Py_BuildValue("(LLLN)", (long long)(shape >> 16), (long long)slot, (long long)token, list);
        if (item == NULL)
            goto fail;
        int rc = PyList_Append(records, item);
        Py_DECREF(item);
        if (rc < 0)
            goto fail;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(NL)", records, lost);
fail:
    Py_XDECREF(records);
    PyBuffer_Release(&view);
    return NULL;
}

static PyMethodDef methods[] = {
    {"write_record", (PyCFunction)(void (*)(void))write_record, METH_FASTCALL,
     "One record of ours into the ring, then its head (pick_log.py's PickLog.append_python)."},
    {"read_records", (PyCFunction)(void (*)(void))read_records, METH_FASTCALL,
     "The whole records of one ring's range, and how many were overwritten (pick_log.py's read_python)."},
    {NULL, NULL, 0, NULL},
};

EPP_OPTIONAL_MODULE(PyInit__pick_log, "epp.app._pick_log",
                    "The serving workers' pick log, a record per call (see pick_log.py).", methods, NULL)
