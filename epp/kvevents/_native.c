/* The numpy-bound steps of a pick, compiled: a request's block keys and the shared table's per-endpoint prefix
 * counts (precise pick), and a prompt's chained block hashes (prefix-cache scorer). Built at install when a compiler
 * is there (setup.py: optional); `epp.kvevents.kernels` decides at import whether these or the numpy code run.
 *
 * These are not definitions of their own: `BlockKeys.request_keys` (epp/kvevents/blockkeys.py),
 * `SharedBlockTable.prefix_blocks` (epp/kvevents/shared.py) and `BlockHasher.hash_bytes` (epp/scheduling/hashing.py)
 * are, and every constant (the per-position multipliers, the mix's multiplier and shifts, E, M, the root, the bucket
 * size, the probe bound, the home shift, the hash's shift and seed) is passed in from there; property tests hold the
 * two equal. Buffers only (the buffer protocol), no numpy C API.
 *
 * Reading the table follows its writer protocol (shared.py): a new slot's mask is written before its key and a key
 * never changes once written, so a slot's key is loaded (acquire) before its mask; mask words are aligned 8-byte
 * loads, never torn. EPP_NATIVE=0 in the environment at import sets ENABLED to 0 (the numpy code then runs). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../optional_module.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int
u64_arg(PyObject *o, uint64_t *out, const char *what)
{
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_ValueError, "%s must be an int in 0..2^64-1", what);
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

static int
ssize_arg(PyObject *o, Py_ssize_t *out, const char *what)
{
    Py_ssize_t v = PyLong_AsSsize_t(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < 0) {
        PyErr_Format(PyExc_ValueError, "%s must not be negative", what);
        return -1;
    }
    *out = v;
    return 0;
}

static int
aligned8(const Py_buffer *b, const char *what)
{
    if (((uintptr_t)b->buf & 7u) != 0) {
        PyErr_Format(PyExc_ValueError, "%s is not 8-byte aligned", what);
        return -1;
    }
    return 0;
}

/* request_keys(tokens, width, n, k, c1, s1, s2, e, m, root, out) -> None
 *
 * tokens: token ids, `width` (4 or 8) bytes each, native (little-endian) order; n: whole blocks to key;
 * k: the B per-position multipliers K_t (uint64); out: n uint64, written. For block i:
 *   x = Σ_t tokens[i·B + t]·K_t;  x ^= x >> s1;  x *= c1;  x ^= x >> s2;  key = key·m + e·x   (mod 2^64)
 * from key = root: the recurrence of blockkeys.py, which numpy evaluates in closed form. */
static PyObject *
request_keys(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "request_keys takes 11 arguments");
        return NULL;
    }
    Py_ssize_t width, n;
    uint64_t c1, s1, s2, e, m, root;
    if (ssize_arg(args[1], &width, "width") < 0 || ssize_arg(args[2], &n, "n") < 0 || u64_arg(args[4], &c1, "c1") < 0 ||
        u64_arg(args[5], &s1, "s1") < 0 || u64_arg(args[6], &s2, "s2") < 0 || u64_arg(args[7], &e, "e") < 0 ||
        u64_arg(args[8], &m, "m") < 0 || u64_arg(args[9], &root, "root") < 0)
        return NULL;
    if (width != 4 && width != 8) {
        PyErr_SetString(PyExc_ValueError, "width must be 4 or 8");
        return NULL;
    }
    if (s1 > 63 || s2 > 63) {
        PyErr_SetString(PyExc_ValueError, "shifts must be in 0..63");
        return NULL;
    }
    Py_buffer tok, kb, out;
    if (PyObject_GetBuffer(args[0], &tok, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[3], &kb, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&tok);
        return NULL;
    }
    if (PyObject_GetBuffer(args[10], &out, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&kb);
        PyBuffer_Release(&tok);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t b = kb.len / 8;
    if (b < 1 || kb.len % 8) {
        PyErr_SetString(PyExc_ValueError, "k must hold at least one uint64");
        goto done;
    }
    if (n > PY_SSIZE_T_MAX / b / width || tok.len < n * b * width) {
        PyErr_SetString(PyExc_ValueError, "tokens hold fewer than n blocks");
        goto done;
    }
    if (out.len < n * 8) {
        PyErr_SetString(PyExc_ValueError, "out holds fewer than n uint64");
        goto done;
    }
    if (aligned8(&kb, "k") < 0 || aligned8(&out, "out") < 0)
        goto done;
    const uint64_t *k = (const uint64_t *)kb.buf;
    uint64_t *keys = (uint64_t *)out.buf;
    const unsigned char *t = (const unsigned char *)tok.buf;
    uint64_t key = root;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t x = 0;
        if (width == 4) {
            const unsigned char *p = t + (size_t)i * (size_t)b * 4u;
            for (Py_ssize_t j = 0; j < b; j++) {
                uint32_t v;
                memcpy(&v, p + 4 * j, 4);
                x += (uint64_t)v * k[j];
            }
        }
        else {
            const unsigned char *p = t + (size_t)i * (size_t)b * 8u;
            for (Py_ssize_t j = 0; j < b; j++) {
                uint64_t v;
                memcpy(&v, p + 8 * j, 8);
                x += v * k[j];
            }
        }
        x ^= x >> s1;
        x *= c1;
        x ^= x >> s2;
        key = key * m + e * x;
        keys[i] = key;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&out);
    PyBuffer_Release(&kb);
    PyBuffer_Release(&tok);
    return result;
}

static inline uint64_t
load_key(const uint64_t *p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

static inline uint64_t
load_mask(const uint64_t *p)
{
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}

/* The slot of `key` in bucket `bucket`: its index, −1 when the bucket has it not, and *full set when the bucket's
 * last slot is taken (the writer fills a bucket in order, so that is a full bucket). */
static inline Py_ssize_t
in_bucket(const uint64_t *tkeys, Py_ssize_t bucket, Py_ssize_t size, uint64_t key, int *full)
{
    const uint64_t *row = tkeys + bucket * size;
    for (Py_ssize_t j = 0; j < size; j++) {
        uint64_t v = load_key(row + j);
        if (v == key)
            return bucket * size + j;
        if (v == 0) {
            *full = 0;
            return -1;
        }
    }
    *full = 1;
    return -1;
}

/* prefix_blocks(keys, table_keys, table_masks, words, shift, bucket, max_probe, out) -> int
 *
 * keys: the request's n block keys (uint64); table_keys: the table's C slot keys; table_masks: its C × words mask
 * words; out: 64 × words uint64, overwritten with each endpoint slot's count of leading keys held. Returns the
 * number of leading keys found in the table. A key's home bucket is key >> shift (0 when shift is 64: one bucket);
 * a key missing from its home bucket is looked for in the `max_probe` buckets after it only when home is full, as
 * shared.py's reader does, and the first key not found ends every prefix. */
static PyObject *
prefix_blocks(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "prefix_blocks takes 8 arguments");
        return NULL;
    }
    Py_ssize_t words, shift, size, max_probe;
    if (ssize_arg(args[3], &words, "words") < 0 || ssize_arg(args[4], &shift, "shift") < 0 ||
        ssize_arg(args[5], &size, "bucket") < 0 || ssize_arg(args[6], &max_probe, "max_probe") < 0)
        return NULL;
    if (words < 1 || size < 1 || shift > 64) {
        PyErr_SetString(PyExc_ValueError, "words and bucket must be positive, shift at most 64");
        return NULL;
    }
    Py_buffer kb, tk, tm, out;
    if (PyObject_GetBuffer(args[0], &kb, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &tk, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&kb);
        return NULL;
    }
    if (PyObject_GetBuffer(args[2], &tm, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&tk);
        PyBuffer_Release(&kb);
        return NULL;
    }
    if (PyObject_GetBuffer(args[7], &out, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&tm);
        PyBuffer_Release(&tk);
        PyBuffer_Release(&kb);
        return NULL;
    }
    PyObject *result = NULL;
    uint64_t *acc = NULL;
    Py_ssize_t n = kb.len / 8, capacity = tk.len / 8;
    Py_ssize_t nbuckets = capacity / size;
    if (kb.len % 8 || tk.len % 8 || nbuckets < 1 || capacity % size) {
        PyErr_SetString(PyExc_ValueError, "keys and table keys must be uint64, whole buckets");
        goto done;
    }
    if (capacity > PY_SSIZE_T_MAX / 8 / words || tm.len < capacity * words * 8) {
        PyErr_SetString(PyExc_ValueError, "table masks hold fewer than capacity × words uint64");
        goto done;
    }
    if (out.len < 64 * words * 8) {
        PyErr_SetString(PyExc_ValueError, "out holds fewer than 64 × words uint64");
        goto done;
    }
    if (aligned8(&kb, "keys") < 0 || aligned8(&tk, "table keys") < 0 || aligned8(&tm, "table masks") < 0 ||
        aligned8(&out, "out") < 0)
        goto done;
    acc = (uint64_t *)PyMem_Malloc((size_t)words * 8u);
    if (acc == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const uint64_t *keys = (const uint64_t *)kb.buf;
    const uint64_t *tkeys = (const uint64_t *)tk.buf;
    const uint64_t *tmasks = (const uint64_t *)tm.buf;
    uint64_t *counts = (uint64_t *)out.buf;
    memset(counts, 0, (size_t)(64 * words) * 8u);
    Py_ssize_t last = nbuckets - 1, rows = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t key = keys[i];
        Py_ssize_t home = shift >= 64 ? 0 : (Py_ssize_t)(key >> shift);
        if (home > last) {
            PyErr_SetString(PyExc_ValueError, "shift does not match the table's bucket count");
            goto done;
        }
        int full = 0;
        Py_ssize_t slot = in_bucket(tkeys, home, size, key, &full);
        /* past a full home bucket: the buckets after it, until one has room (shared.py `_find` from home + 1) */
        for (Py_ssize_t probe = 0, bucket = home; slot < 0 && full && probe < max_probe; probe++) {
            bucket = bucket < last ? bucket + 1 : 0;
            slot = in_bucket(tkeys, bucket, size, key, &full);
        }
        if (slot < 0)
            break;
        const uint64_t *mask = tmasks + slot * words;
        uint64_t any = 0;
        if (i == 0) {
            for (Py_ssize_t w = 0; w < words; w++)
                any |= acc[w] = load_mask(mask + w);
        }
        else {
            for (Py_ssize_t w = 0; w < words; w++) {
                uint64_t held = acc[w] & load_mask(mask + w);
                uint64_t dropped = acc[w] & ~held; /* these endpoints' prefixes end before row i */
                while (dropped) {
                    counts[64 * w + __builtin_ctzll(dropped)] = (uint64_t)i;
                    dropped &= dropped - 1;
                }
                any |= acc[w] = held;
            }
        }
        rows = i + 1;
        if (!any)
            break;
    }
    if (rows) {
        for (Py_ssize_t w = 0; w < words; w++) {
            uint64_t held = acc[w];
            while (held) {
                counts[64 * w + __builtin_ctzll(held)] = (uint64_t)rows;
                held &= held - 1;
            }
        }
    }
    result = PyLong_FromSsize_t(rows);
done:
    PyMem_Free(acc);
    PyBuffer_Release(&out);
    PyBuffer_Release(&tm);
    PyBuffer_Release(&tk);
    PyBuffer_Release(&kb);
    return result;
}

/* Block j of the chain both prompt hash calls compute: acc (the hash of block j − 1, or the seed) plus the c_i of
 * block j's words, i.e. h[j] = seed + Σ_{i < (j+1)·words} c_i (mod 2^64). */
static inline uint64_t
chain_block(const unsigned char *w, const uint64_t *k, Py_ssize_t words, Py_ssize_t j, uint64_t shift, uint64_t acc)
{
    for (Py_ssize_t t = 0; t < words; t++) {
        Py_ssize_t i = j * words + t;
        uint64_t x;
        memcpy(&x, w + 8 * i, 8);
        x *= k[i];
        acc += x ^ (x >> shift);
    }
    return acc;
}

/* prompt_hashes(data, words, n, k, shift, seed, out) -> None
 *
 * The prefix scorer's chained block hashes (epp/scheduling/hashing.py, `BlockHasher.hash_bytes`): data read as
 * little-endian uint64 words w_i (i < n·words), k the per-position multipliers; c_i = x ^ (x >> shift) with
 * x = w_i·K_i, and out[j] = seed + Σ_{i < (j+1)·words} c_i (mod 2^64), for each of the n blocks. */
static PyObject *
prompt_hashes(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "prompt_hashes takes 7 arguments");
        return NULL;
    }
    Py_ssize_t words, n;
    uint64_t shift, seed;
    if (ssize_arg(args[1], &words, "words") < 0 || ssize_arg(args[2], &n, "n") < 0 ||
        u64_arg(args[4], &shift, "shift") < 0 || u64_arg(args[5], &seed, "seed") < 0)
        return NULL;
    if (words < 1 || shift > 63) {
        PyErr_SetString(PyExc_ValueError, "words must be positive and the shift in 0..63");
        return NULL;
    }
    Py_buffer data, kb, out;
    if (PyObject_GetBuffer(args[0], &data, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[3], &kb, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    if (PyObject_GetBuffer(args[6], &out, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&kb);
        PyBuffer_Release(&data);
        return NULL;
    }
    PyObject *result = NULL;
    if (n > PY_SSIZE_T_MAX / words / 8 || data.len < n * words * 8 || kb.len < n * words * 8) {
        PyErr_SetString(PyExc_ValueError, "data or k hold fewer than n blocks of words");
        goto done;
    }
    if (out.len < n * 8) {
        PyErr_SetString(PyExc_ValueError, "out holds fewer than n uint64");
        goto done;
    }
    if (aligned8(&kb, "k") < 0 || aligned8(&out, "out") < 0)
        goto done;
    const unsigned char *w = (const unsigned char *)data.buf;
    const uint64_t *k = (const uint64_t *)kb.buf;
    uint64_t *h = (uint64_t *)out.buf;
    uint64_t acc = seed;
    for (Py_ssize_t j = 0; j < n; j++)
        h[j] = acc = chain_block(w, k, words, j, shift, acc);
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&out);
    PyBuffer_Release(&kb);
    PyBuffer_Release(&data);
    return result;
}

/* prompt_hash_list(data, words, max_blocks, k, shift, seed) -> list[int]
 *
 * `prompt_hashes` of the n = min(len(data) // (8·words), max_blocks) whole blocks of data (`hash_bytes`' n),
 * answered as a list of Python ints (what the prefix index keys on: `hash_bytes(...).tolist()`), with no uint64
 * array made and read back. */
static PyObject *
prompt_hash_list(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "prompt_hash_list takes 6 arguments");
        return NULL;
    }
    Py_ssize_t words, max_blocks;
    uint64_t shift, seed;
    if (ssize_arg(args[1], &words, "words") < 0 || ssize_arg(args[2], &max_blocks, "max_blocks") < 0 ||
        u64_arg(args[4], &shift, "shift") < 0 || u64_arg(args[5], &seed, "seed") < 0)
        return NULL;
    if (words < 1 || words > PY_SSIZE_T_MAX / 8 || shift > 63) {
        PyErr_SetString(PyExc_ValueError, "words must be positive and the shift in 0..63");
        return NULL;
    }
    Py_buffer data, kb;
    if (PyObject_GetBuffer(args[0], &data, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[3], &kb, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t n = data.len / (8 * words);
    if (n > max_blocks)
        n = max_blocks;
    if (n > PY_SSIZE_T_MAX / words / 8 || data.len < n * words * 8 || kb.len < n * words * 8) {
        PyErr_SetString(PyExc_ValueError, "data or k hold fewer than n blocks of words");
        goto done;
    }
    if (aligned8(&kb, "k") < 0)
        goto done;
    result = PyList_New(n);
    if (result == NULL)
        goto done;
    const unsigned char *w = (const unsigned char *)data.buf;
    const uint64_t *k = (const uint64_t *)kb.buf;
    uint64_t acc = seed;
    for (Py_ssize_t j = 0; j < n; j++) {
        acc = chain_block(w, k, words, j, shift, acc);
        PyObject *v = PyLong_FromUnsignedLongLong(acc);
        if (v == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, j, v);
    }
done:
    PyBuffer_Release(&kb);
    PyBuffer_Release(&data);
    return result;
}

static PyMethodDef methods[] = {
    {"request_keys", (PyCFunction)(void (*)(void))request_keys, METH_FASTCALL,
     "A request's block keys into `out` (blockkeys.py's recurrence, its constants as arguments)."},
    {"prefix_blocks", (PyCFunction)(void (*)(void))prefix_blocks, METH_FASTCALL,
     "Per endpoint slot, the leading keys it holds, into `out`; returns the leading keys found (shared.py)."},
    {"prompt_hashes", (PyCFunction)(void (*)(void))prompt_hashes, METH_FASTCALL,
     "A prompt's chained block hashes into `out` (hashing.py's prefix identifiers, its constants as arguments)."},
    {"prompt_hash_list", (PyCFunction)(void (*)(void))prompt_hash_list, METH_FASTCALL,
     "A prompt's chained block hashes as a list of ints (prompt_hashes, no array)."},
    {NULL, NULL, 0, NULL},
};

EPP_OPTIONAL_MODULE(PyInit__native, "epp.kvevents._native",
                    "Compiled block keys and table lookups (see kernels.py).", methods, NULL)
