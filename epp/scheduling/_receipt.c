/* A route receipt's costly steps, compiled: the chosen endpoint's and the runner-up's terms read from a detailed
 * pick, the receipt's JSON, the (address, score) pairs of the scores it goes with,
 * and the chosen endpoint's metrics age with the candidates' unusable-data counts. Built at install when a
 * compiler is there (setup.py: optional); epp.scheduling.receipt decides at import whether these or the Python code
 * run.
 *
 * `receipt_of` is the two read steps and the receipt's assembly in one call (the read of every emitted receipt).
 * Not definitions of their own: `pick_terms_python`, `Receipt.json_python`, `scored_pairs_python`,
 * `signal_health_python` and `ReceiptReader.read_python` (epp/scheduling/receipt.py) are, and tests/scheduling/test_receipt_native.py holds each
 * pair equal on random inputs (the same doubles, the same bytes).
 * Every step is the Python code's in its order: the chosen candidate found by bisect_left's own halving, the runner-up
 * by max()'s comparisons (the first greater replaces) and list.index, a term's extremes by max()/min() over it; the
 * JSON as orjson writes it (shortest round-trip doubles, positional notation from 1e-5 to below 1e16, "1e-7" and
 * "1e+16" beyond; NaN and infinities as null; strings UTF-8 with orjson's escapes). An input of another shape (an
 * array that is not contiguous int64/float64, a number that is not a float, a scorer named twice) answers
 * NotImplemented and the Python code runs. EPP_NATIVE=0 in the environment at import sets ENABLED to 0. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../optional_module.h"
#include "../struct_wire.h"
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_TERMS 64

static int
buffer_of(PyObject *o, Py_buffer *view, const char *formats)
{
    if (PyObject_GetBuffer(o, view, PyBUF_FORMAT | PyBUF_STRIDES) < 0)
        return -1;
    if (view->itemsize != 8 || view->format == NULL || view->format[0] == '\0' || view->format[1] != '\0' ||
        strchr(formats, view->format[0]) == NULL || !PyBuffer_IsContiguous(view, 'C')) {
        PyBuffer_Release(view);
        return 1;
    }
    return 0;
}

/* The float objects of the last terms made here, by their bits (direct-mapped, FLOATS entries, each held): a pick's
 * terms repeat from one pick to the next (2.0, 1.125, 0.0, 3.0000000000000004), and a hit is a compare and a
 * reference where a new float is an allocation now and a free when its receipt is folded. A float is immutable and
 * a receipt's are read by value only. Under the GIL, as every call here. */
#define FLOATS 32
static PyObject *floats[FLOATS];

static PyObject *
float_of(double x)
{
    uint64_t bits;
    memcpy(&bits, &x, 8);
    uint64_t mixed = (bits ^ (bits >> 29)) * 0xbf58476d1ce4e5b9ULL;
    unsigned at = (unsigned)(mixed >> 59); /* 5 bits: FLOATS */
    PyObject *held = floats[at];
    if (held != NULL) {
        double y = PyFloat_AS_DOUBLE(held);
        uint64_t held_bits;
        memcpy(&held_bits, &y, 8);
        if (held_bits == bits)
            return Py_NewRef(held);
    }
    PyObject *made = PyFloat_FromDouble(x);
    if (made != NULL)
        Py_XSETREF(floats[at], Py_NewRef(made));
    return made;
}

static PyObject *
float_tuple(const double *values, Py_ssize_t n)
{
    PyObject *out = PyTuple_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = float_of(values[i]);
        if (x == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, x);
    }
    return out;
}

/* pick_terms(scored, total, primary, named, rows) -> (runner slot, chosen terms, runner terms, inert) | NotImplemented
 *
 * scored: the candidates scored (int64), total: their totals (float64); named: the detailed run's list of (scorer,
 * has a term, constant); rows: its terms, one row of len(scored) float64 per scorer that has one (None: none). */
static PyObject *
pick_terms(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "pick_terms takes scored, total, primary, named and rows");
        return NULL;
    }
    PyObject *named = args[3];
    if (!PyList_CheckExact(named) || PyList_GET_SIZE(named) > MAX_TERMS || !PyLong_CheckExact(args[2]))
        return Py_NewRef(Py_NotImplemented);
    long long primary = PyLong_AsLongLong(args[2]);
    if (primary == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return Py_NewRef(Py_NotImplemented);
    }
    Py_ssize_t k = PyList_GET_SIZE(named);
    Py_buffer scored_view, total_view, rows_view;
    int has_rows = args[4] != Py_None;
    int got = buffer_of(args[0], &scored_view, "lq");
    if (got != 0)
        return got < 0 ? NULL : Py_NewRef(Py_NotImplemented);
    got = buffer_of(args[1], &total_view, "d");
    if (got != 0) {
        PyBuffer_Release(&scored_view);
        return got < 0 ? NULL : Py_NewRef(Py_NotImplemented);
    }
    if (has_rows) {
        got = buffer_of(args[4], &rows_view, "d");
        if (got != 0) {
            PyBuffer_Release(&scored_view);
            PyBuffer_Release(&total_view);
            return got < 0 ? NULL : Py_NewRef(Py_NotImplemented);
        }
    }
    PyObject *result = NULL;
    const int64_t *slots = (const int64_t *)scored_view.buf;
    const double *total = (const double *)total_view.buf;
    const double *rows = has_rows ? (const double *)rows_view.buf : NULL;
    Py_ssize_t n = scored_view.len / 8;
    Py_ssize_t row_count = has_rows ? rows_view.len / 8 / (n > 0 ? n : 1) : 0;
    if (total_view.len != scored_view.len || (has_rows && rows_view.len != row_count * n * 8)) {
        result = Py_NewRef(Py_NotImplemented);
        goto done;
    }
    /* bisect_left, step by step */
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = ((size_t)lo + hi) / 2;
        if (slots[mid] < primary)
            lo = mid + 1;
        else
            hi = mid;
    }
    Py_ssize_t chosen = (n > 0 && lo < n && slots[lo] == primary) ? lo : -1;
    Py_ssize_t runner = -1;
    if (chosen >= 0 && n > 1) {
        /* totals[chosen] = -inf; runner = totals.index(max(totals)) */
        Py_ssize_t best = 0;
        double top = chosen == 0 ? -INFINITY : total[0];
        for (Py_ssize_t i = 1; i < n; i++) {
            double x = i == chosen ? -INFINITY : total[i];
            if (x > top) {
                top = x;
                best = i;
            }
        }
        runner = best;
        for (Py_ssize_t i = 0; i < best; i++) {
            double x = i == chosen ? -INFINITY : total[i];
            if (x == top) {
                runner = i;
                break;
            }
        }
    }
    Py_ssize_t count = chosen >= 0 ? k : 0;
    double chosen_terms[MAX_TERMS] = {0}, runner_terms[MAX_TERMS] = {0};
    PyObject *inert = PyTuple_New(runner >= 0 ? count : 0);
    if (inert == NULL)
        goto done;
    Py_ssize_t row = 0;
    for (Py_ssize_t t = 0; t < count; t++) {
        PyObject *item = PyList_GET_ITEM(named, t);
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 3 || !PyBool_Check(PyTuple_GET_ITEM(item, 1)) ||
            !PyFloat_CheckExact(PyTuple_GET_ITEM(item, 2)) || (PyTuple_GET_ITEM(item, 1) == Py_True && row >= row_count)) {
            Py_DECREF(inert);
            result = Py_NewRef(Py_NotImplemented);
            goto done;
        }
        double constant = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(item, 2));
        int dead;
        if (PyTuple_GET_ITEM(item, 1) != Py_True) {
            chosen_terms[t] = runner_terms[t] = constant;
            dead = constant == 0.0;
        } else {
            const double *v = rows + row * n;
            row++;
            chosen_terms[t] = constant + v[chosen];
            if (runner >= 0)
                runner_terms[t] = constant + v[runner];
            double top = v[0], bottom = v[0];
            for (Py_ssize_t i = 1; i < n; i++) {
                if (v[i] > top)
                    top = v[i];
                if (v[i] < bottom)
                    bottom = v[i];
            }
            dead = constant + top == 0.0 && constant + bottom == 0.0;
        }
        if (runner >= 0)
            PyTuple_SET_ITEM(inert, t, Py_NewRef(dead ? Py_True : Py_False));
    }
    PyObject *chosen_out = float_tuple(chosen_terms, count);
    PyObject *runner_out = float_tuple(runner_terms, runner >= 0 ? count : 0);
    if (chosen_out == NULL || runner_out == NULL) {
        Py_XDECREF(chosen_out);
        Py_XDECREF(runner_out);
        Py_DECREF(inert);
        goto done;
    }
    /* the tuple built directly: Py_BuildValue's format parsing costs ~600 instructions a call */
    PyObject *runner_slot = PyLong_FromLongLong(runner >= 0 ? (long long)slots[runner] : -1LL);
    result = runner_slot != NULL ? PyTuple_New(4) : NULL;
    if (result == NULL) {
        Py_XDECREF(runner_slot);
        Py_DECREF(chosen_out);
        Py_DECREF(runner_out);
        Py_DECREF(inert);
        goto done;
    }
    PyTuple_SET_ITEM(result, 0, runner_slot);
    PyTuple_SET_ITEM(result, 1, chosen_out);
    PyTuple_SET_ITEM(result, 2, runner_out);
    PyTuple_SET_ITEM(result, 3, inert);
done:
    if (has_rows)
        PyBuffer_Release(&rows_view);
    PyBuffer_Release(&scored_view);
    PyBuffer_Release(&total_view);
    return result;
}

/* scored_pairs(addresses, slots, scores) -> ((addresses[slot], score), ...) | NotImplemented
 *
 * addresses: a tuple or list of str; slots (int64) and scores (float64) of one length, each slot an index into
 * addresses (anything else: the Python code answers, or raises). */
static PyObject *
scored_pairs(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "scored_pairs takes addresses, slots and scores");
        return NULL;
    }
    PyObject *addresses = args[0];
    if (!PyTuple_CheckExact(addresses) && !PyList_CheckExact(addresses))
        return Py_NewRef(Py_NotImplemented);
    Py_buffer slots_view, scores_view;
    int got = buffer_of(args[1], &slots_view, "lq");
    if (got != 0)
        return got < 0 ? NULL : Py_NewRef(Py_NotImplemented);
    got = buffer_of(args[2], &scores_view, "d");
    if (got != 0) {
        PyBuffer_Release(&slots_view);
        return got < 0 ? NULL : Py_NewRef(Py_NotImplemented);
    }
    PyObject *result = NULL;
    Py_ssize_t n = slots_view.len / 8;
    const int64_t *slots = (const int64_t *)slots_view.buf;
    const double *scores = (const double *)scores_view.buf;
    Py_ssize_t size = PySequence_Fast_GET_SIZE(addresses);
    PyObject **items = PySequence_Fast_ITEMS(addresses);
    if (scores_view.len != slots_view.len) {
        result = Py_NewRef(Py_NotImplemented);
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (slots[i] < 0 || slots[i] >= size || !PyUnicode_CheckExact(items[slots[i]])) {
            result = Py_NewRef(Py_NotImplemented);
            goto done;
        }
    PyObject *out = PyTuple_New(n);
    if (out == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *score = PyFloat_FromDouble(scores[i]);
        PyObject *pair = score != NULL ? PyTuple_New(2) : NULL;
        if (pair == NULL) {
            Py_XDECREF(score);
            Py_DECREF(out);
            goto done;
        }
        PyTuple_SET_ITEM(pair, 0, Py_NewRef(items[slots[i]]));
        PyTuple_SET_ITEM(pair, 1, score);
        PyTuple_SET_ITEM(out, i, pair);
    }
    result = out;
done:
    PyBuffer_Release(&slots_view);
    PyBuffer_Release(&scores_view);
    return result;
}

/* signal_health(scraped_at, failures, candidates, primary, now, staleness_s, max_failures)
 *     -> (the primary's metrics age, stale, missing) | NotImplemented
 *
 * scraped_at (float64) and failures (int64): the snapshot's columns; candidates (int64): slots into them; primary a
 * slot; now and staleness_s floats, max_failures an int. A candidate whose data is not usable (freshness.usable:
 * scraped at or after now - staleness_s and fewer than max_failures failures) counts stale when it was scraped (a
 * scraped_at that is not NaN), missing when not; the age is now - scraped_at[primary], inf when that is NaN. */
static PyObject *
health_of(PyObject *const *args, Py_ssize_t *count)
{
    if (!PyLong_CheckExact(args[3]) || !PyFloat_CheckExact(args[4]) || !PyFloat_CheckExact(args[5]) ||
        !PyLong_CheckExact(args[6]))
        return Py_NewRef(Py_NotImplemented);
    int overflow = 0;
    long long primary = PyLong_AsLongLongAndOverflow(args[3], &overflow);
    if (overflow)
        return Py_NewRef(Py_NotImplemented);
    long long max_failures = PyLong_AsLongLongAndOverflow(args[6], &overflow);
    if (overflow)
        return Py_NewRef(Py_NotImplemented);
    if ((primary == -1 || max_failures == -1) && PyErr_Occurred())
        return NULL;
    double now = PyFloat_AS_DOUBLE(args[4]);
    double since = now - PyFloat_AS_DOUBLE(args[5]);
    Py_buffer scraped_view, failures_view, candidates_view;
    int got = buffer_of(args[0], &scraped_view, "d");
    if (got != 0)
        return got < 0 ? NULL : Py_NewRef(Py_NotImplemented);
    got = buffer_of(args[1], &failures_view, "lq");
    if (got != 0) {
        PyBuffer_Release(&scraped_view);
        return got < 0 ? NULL : Py_NewRef(Py_NotImplemented);
    }
    got = buffer_of(args[2], &candidates_view, "lq");
    if (got != 0) {
        PyBuffer_Release(&scraped_view);
        PyBuffer_Release(&failures_view);
        return got < 0 ? NULL : Py_NewRef(Py_NotImplemented);
    }
    PyObject *result = NULL;
    Py_ssize_t size = scraped_view.len / 8;
    const double *scraped = (const double *)scraped_view.buf;
    const int64_t *failures = (const int64_t *)failures_view.buf;
    const int64_t *candidates = (const int64_t *)candidates_view.buf;
    Py_ssize_t n = candidates_view.len / 8;
    *count = n;
    if (failures_view.len != scraped_view.len || primary < 0 || primary >= size) {
        result = Py_NewRef(Py_NotImplemented);
        goto done;
    }
    long stale = 0, missing = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t slot = candidates[i];
        if (slot < 0 || slot >= size) {
            result = Py_NewRef(Py_NotImplemented);
            goto done;
        }
        double at = scraped[slot];
        if (!(at >= since && failures[slot] < max_failures)) {
            if (at == at)
                stale++;
            else
                missing++;
        }
    }
    double last = scraped[primary];
    PyObject *age = PyFloat_FromDouble(last == last ? now - last : (double)INFINITY);
    PyObject *stale_n = age != NULL ? PyLong_FromLong(stale) : NULL;
    PyObject *missing_n = stale_n != NULL ? PyLong_FromLong(missing) : NULL;
    result = missing_n != NULL ? PyTuple_New(3) : NULL;
    if (result == NULL) {
        Py_XDECREF(age);
        Py_XDECREF(stale_n);
        Py_XDECREF(missing_n);
        goto done;
    }
    PyTuple_SET_ITEM(result, 0, age);
    PyTuple_SET_ITEM(result, 1, stale_n);
    PyTuple_SET_ITEM(result, 2, missing_n);
done:
    PyBuffer_Release(&scraped_view);
    PyBuffer_Release(&failures_view);
    PyBuffer_Release(&candidates_view);
    return result;
}

static PyObject *
signal_health(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "signal_health takes scraped_at, failures, candidates, primary, now, staleness_s, max_failures");
        return NULL;
    }
    Py_ssize_t count;
    return health_of(args, &count);
}

static PyObject *empty_str, *no_terms;

/* receipt_of(Receipt, profiles, addresses, scorers, scored, total, primary, named, rows, scraped_at, failures,
 *            candidates, now, staleness_s, max_failures, kv, kv_age, tokens, prefix, flow_wait)
 *     -> Receipt | NotImplemented
 *
 * `ReceiptReader.read_python`'s receipt in one call: pick_terms (when `scored` is not None) and signal_health as
 * above, the chosen endpoint's and the runner-up's addresses, and the fields the reader passes as they are (kv,
 * tokens and prefix: what its producers said). `scorers` is the receipt's only when `named` has one entry per
 * scorer (else NotImplemented: the Python code names them from `named`); a primary outside `addresses` likewise. */
static PyObject *
receipt_of(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 20) {
        PyErr_SetString(PyExc_TypeError, "receipt_of takes 20 arguments (receipt.py's ReceiptReader.read)");
        return NULL;
    }
    PyObject *type = args[0], *addresses = args[2], *scorers = args[3], *named = args[7];
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &PyTuple_Type) ||
        (!PyTuple_CheckExact(addresses) && !PyList_CheckExact(addresses)) || !PyTuple_CheckExact(scorers) ||
        !PyList_CheckExact(named) || PyList_GET_SIZE(named) != PyTuple_GET_SIZE(scorers) ||
        !PyLong_CheckExact(args[6]))
        return Py_NewRef(Py_NotImplemented);
    PyObject *terms;
    if (args[4] == Py_None) {
        terms = Py_NewRef(no_terms);
    } else {
        PyObject *pick_args[5] = {args[4], args[5], args[6], named, args[8]};
        terms = pick_terms(self, pick_args, 5);
        if (terms == NULL || !PyTuple_CheckExact(terms))
            return terms;
    }
    PyObject *health_args[7] = {args[9], args[10], args[11], args[6], args[12], args[13], args[14]};
    Py_ssize_t count = 0;
    PyObject *health = health_of(health_args, &count);
    if (health == NULL || !PyTuple_CheckExact(health)) {
        Py_DECREF(terms);
        return health;
    }
    PyObject *result = NULL;
    Py_ssize_t size = PySequence_Fast_GET_SIZE(addresses);
    PyObject **items = PySequence_Fast_ITEMS(addresses);
    long long primary = PyLong_AsLongLong(args[6]); /* in range: signal_health took it */
    long long runner = PyLong_AsLongLong(PyTuple_GET_ITEM(terms, 0));
    if (primary < 0 || primary >= size || runner >= size || (runner == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        result = Py_NewRef(Py_NotImplemented);
        goto done;
    }
    PyObject *candidates = PyLong_FromSsize_t(count);
    if (candidates == NULL)
        goto done;
    result = ((PyTypeObject *)type)->tp_alloc((PyTypeObject *)type, 16);
    if (result == NULL) {
        Py_DECREF(candidates);
        goto done;
    }
    PyObject *fields[16] = {
        args[1], items[primary], runner >= 0 ? items[runner] : empty_str, scorers,
        PyTuple_GET_ITEM(terms, 1), PyTuple_GET_ITEM(terms, 2), PyTuple_GET_ITEM(terms, 3),
        PyTuple_GET_ITEM(health, 0), PyTuple_GET_ITEM(health, 1), PyTuple_GET_ITEM(health, 2),
        args[15], args[16], args[17], args[18], NULL, args[19],
    };
    for (int i = 0; i < 16; i++)
        PyTuple_SET_ITEM(result, i, i == 14 ? candidates : Py_NewRef(fields[i]));
done:
    Py_DECREF(terms);
    Py_DECREF(health);
    return result;
}

/* -- JSON, as orjson writes it ------------------------------------------------------------------------------- */

typedef struct {
    char *buf;
    Py_ssize_t len, cap;
    int ascii; /* every str written was ASCII: the text is made without UTF-8's decoding */
    char small[1024];
} Out;

static int
reserve(Out *o, Py_ssize_t more)
{
    if (o->len + more <= o->cap)
        return 0;
    Py_ssize_t cap = (o->cap + more) * 2;
    char *buf = o->buf == o->small ? PyMem_Malloc(cap) : PyMem_Realloc(o->buf, cap);
    if (buf == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (o->buf == o->small)
        memcpy(buf, o->small, o->len);
    o->buf = buf;
    o->cap = cap;
    return 0;
}

static inline __attribute__((always_inline)) int
put(Out *o, const char *s, Py_ssize_t n)
{
    if (reserve(o, n) < 0)
        return -1;
    memcpy(o->buf + o->len, s, n);
    o->len += n;
    return 0;
}

#define PUT(o, lit) put((o), (lit), (Py_ssize_t)sizeof(lit) - 1)

/* Whether none of 8 bytes needs an escape (a control character, '"', '\\'): the exact "has a byte less than" and
 * "has a zero byte" word tests (a borrow only ever spreads above a byte that matches) */
static inline int
clean8(uint64_t x)
{
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    uint64_t control = (x - ones * 0x20) & ~x & highs;
    uint64_t quote = x ^ (ones * (unsigned char)'"'), backslash = x ^ (ones * (unsigned char)'\\');
    quote = (quote - ones) & ~quote & highs;
    backslash = (backslash - ones) & ~backslash & highs;
    return !(control | quote | backslash);
}

/* 1: not a str orjson writes (not exact str, surrogates: the Python code answers or raises) */
static int
put_str_text(Out *o, PyObject *s)
{
    if (!PyUnicode_CheckExact(s))
        return 1;
    Py_ssize_t n;
    const char *u = PyUnicode_AsUTF8AndSize(s, &n);
    if (u == NULL) {
        PyErr_Clear();
        return 1;
    }
    if (!PyUnicode_IS_ASCII(s))
        o->ascii = 0;
    if (reserve(o, 6 * n + 2) < 0)
        return -1;
    char *w = o->buf + o->len;
    *w++ = '"';
    Py_ssize_t plain = 0; /* the leading run that needs no escape (all of it, usually): one copy */
    while (plain + 8 <= n) { /* eight bytes at a time */
        uint64_t x;
        memcpy(&x, u + plain, 8);
        if (!clean8(x))
            break;
        plain += 8;
    }
    if (plain < n && n >= 8 && plain + 8 > n) { /* the last (under 8) bytes: the last eight, overlapping, at once */
        uint64_t x;
        memcpy(&x, u + n - 8, 8);
        if (clean8(x))
            plain = n;
    }
    while (plain < n && (unsigned char)u[plain] >= 0x20 && u[plain] != '"' && u[plain] != '\\')
        plain++;
    memcpy(w, u, plain);
    w += plain;
    for (Py_ssize_t i = plain; i < n; i++) {
        unsigned char c = (unsigned char)u[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            *w++ = (char)c;
            continue;
        }
        *w++ = '\\';
        switch (c) {
        case '"': *w++ = '"'; break;
        case '\\': *w++ = '\\'; break;
        case '\b': *w++ = 'b'; break;
        case '\f': *w++ = 'f'; break;
        case '\n': *w++ = 'n'; break;
        case '\r': *w++ = 'r'; break;
        case '\t': *w++ = 't'; break;
        default:
            *w++ = 'u';
            *w++ = '0';
            *w++ = '0';
            *w++ = "0123456789abcdef"[c >> 4];
            *w++ = "0123456789abcdef"[c & 15];
        }
    }
    *w++ = '"';
    o->len = w - o->buf;
    return 0;
}

/* The JSON text of the last strs written here, by identity (direct-mapped, STR_MEMO entries, each holding its str:
 * an address is not another str's while it is held): a receipt's strs are the same objects pick after pick (the
 * profile's name, its scorers', the pool's addresses), and escaping one costs ~250 instructions where a hit is a
 * compare and a copy. A str is immutable, so a hit writes what `put_str_text` would. Under the GIL, as every call
 * here. */
#define STR_MEMO 64
#define STR_MEMO_TEXT 64
static struct {
    PyObject *s; /* NULL: empty */
    unsigned char len;
    unsigned char ascii;
    char text[STR_MEMO_TEXT];
} str_memo[STR_MEMO];

static int
put_str(Out *o, PyObject *s)
{
    uintptr_t key = (uintptr_t)s;
    unsigned at = (unsigned)((key >> 4) ^ (key >> 10)) & (STR_MEMO - 1);
    if (str_memo[at].s == s) {
        if (!str_memo[at].ascii)
            o->ascii = 0;
        return put(o, str_memo[at].text, str_memo[at].len);
    }
    Py_ssize_t start = o->len;
    int before = o->ascii;
    o->ascii = 1;
    int rc = put_str_text(o, s);
    int ascii = o->ascii;
    o->ascii = before && ascii;
    Py_ssize_t n = o->len - start;
    if (rc == 0 && n <= STR_MEMO_TEXT) {
        Py_XSETREF(str_memo[at].s, Py_NewRef(s));
        str_memo[at].len = (unsigned char)n;
        str_memo[at].ascii = (unsigned char)ascii;
        memcpy(str_memo[at].text, o->buf + start, n);
    }
    return rc;
}

static const double POW10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8};

/* snprintf's "%llu" of n into digits (at least 20 bytes), without a format's parsing (~700 instructions a call);
 * the number of digits */
static int
decimal_digits(char *digits, unsigned long long n)
{
    char reversed[20];
    int nd = 0;
    do {
        reversed[nd++] = (char)('0' + n % 10);
        n /= 10;
    } while (n);
    for (int i = 0; i < nd; i++)
        digits[i] = reversed[nd - 1 - i];
    return nd;
}

/* The shortest decimal of x when it has at most 8 digits after the point (2.0, 1.125, 0.05: most terms and ages),
 * without a shortest-digits search: the least k for which y = round(x × 10^k) gives back x as y / 10^k.
 * That decimal reads back as x (y and 10^k are exact, the division rounds as strtod does), no shorter one does
 * (a k − 1 one would have been found), and it is the only one of k digits that does, so dtoa's. Positional for
 * 1e-4 ≤ |x| < 1e15 only, where repr and orjson are too; zeros too. 1: written, 0: not taken, -1: error. */
static int
put_short(Out *o, double x)
{
    double a = fabs(x);
    if (a == 0.0)
        return (signbit(x) ? PUT(o, "-0.0") : PUT(o, "0.0")) < 0 ? -1 : 1;
    if (!(a >= 1e-4 && a < 1e15))
        return 0;
    for (int k = 0; k <= 8; k++) {
        double p = a * POW10[k];
        /* Below 2^50 the product is within 1/16 of x × 10^k and x's rounding interval is under 0.5 wide there:
         * one k-digit decimal at most reads back as x */
        if (p >= 1125899906842624.0)
            return 0;
        double y = nearbyint(p);
        if (fabs(p - y) > 0.4) /* near the middle: orjson decides */
            return 0;
        if (y / POW10[k] != a)
            continue;
        char digits[24];
        int nd = decimal_digits(digits, (unsigned long long)y);
        if (reserve(o, nd + k + 4) < 0)
            return -1;
        char *w = o->buf + o->len;
        if (x < 0)
            *w++ = '-';
        if (k == 0) {
            memcpy(w, digits, nd);
            w += nd;
            *w++ = '.';
            *w++ = '0';
        } else if (nd > k) {
            memcpy(w, digits, nd - k);
            w += nd - k;
            *w++ = '.';
            memcpy(w, digits + nd - k, k);
            w += k;
        } else {
            *w++ = '0';
            *w++ = '.';
            for (int z = 0; z < k - nd; z++)
                *w++ = '0';
            memcpy(w, digits, nd);
            w += nd;
        }
        o->len = w - o->buf;
        return 1;
    }
    return 0;
}

/* orjson.dumps: the definition's writer (Receipt.json_python encodes with orjson), for a double that is not a short
 * decimal, such as a metrics age `now - scraped_at`, which is never one. Its shortest-digits search (Ryu) costs about
 * a fifth of repr's (dtoa's bignum search, ~7k instructions such a double), and its text is the definition's. */
static PyObject *orjson_dumps;

/* orjson's text of the last doubles it wrote here, by their bits (direct-mapped, MEMO entries): a pick's terms repeat
 * from one pick to the next (3.0000000000000004 for a prefix scorer's full match weighted 3), and a call of
 * orjson.dumps costs ~1.2k instructions where a hit is a compare and a copy. A double's text is a function of its
 * bits alone, so a hit writes what the call would. Under the GIL, as every call here. */
#define MEMO 64
#define MEMO_TEXT 32
static struct {
    uint64_t bits;
    unsigned char len; /* 0: empty */
    char text[MEMO_TEXT];
} memo[MEMO];

static unsigned
memo_slot(uint64_t bits)
{
    bits ^= bits >> 29;
    bits *= 0xbf58476d1ce4e5b9ULL;
    return (unsigned)(bits >> 58); /* 6 bits: MEMO */
}

/* A float as orjson writes it. 1: not a float (the Python code answers) */
static int
put_float(Out *o, PyObject *x)
{
    if (!PyFloat_CheckExact(x))
        return 1;
    double d = PyFloat_AS_DOUBLE(x);
    if (!isfinite(d))
        return PUT(o, "null");
    /* the memo first: it holds only doubles `put_short` does not take, whose nine failed tries (~180 instructions)
     * a hit skips; a short decimal's miss costs a compare */
    uint64_t bits;
    memcpy(&bits, &d, 8);
    unsigned at = memo_slot(bits);
    if (memo[at].len && memo[at].bits == bits)
        return put(o, memo[at].text, memo[at].len);
    int shortened = put_short(o, d);
    if (shortened != 0)
        return shortened < 0 ? -1 : 0;
    PyObject *text = PyObject_CallOneArg(orjson_dumps, x);
    if (text == NULL)
        return -1;
    int rc = 1;
    if (PyBytes_CheckExact(text)) {
        Py_ssize_t n = PyBytes_GET_SIZE(text);
        rc = put(o, PyBytes_AS_STRING(text), n);
        if (rc == 0 && n > 0 && n <= MEMO_TEXT) {
            memo[at].bits = bits;
            memo[at].len = (unsigned char)n;
            memcpy(memo[at].text, PyBytes_AS_STRING(text), n);
        }
    }
    Py_DECREF(text);
    return rc;
}

/* orjson writes a dict of the pairs, a later pair of the same name replacing the value at the first: not done here */
static int
distinct(PyObject *const *names, Py_ssize_t n)
{
    for (Py_ssize_t i = 1; i < n; i++)
        for (Py_ssize_t j = 0; j < i; j++) {
            int same = PyUnicode_Compare(names[i], names[j]);
            if (same == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                return 0;
            }
            if (same == 0)
                return 0;
        }
    return 1;
}

static PyObject *distinct_scorers; /* the last scorers tuple found without a name twice (a tuple: immutable) */

/* The Receipt's fields, by position (epp.scheduling.receipt.Receipt). */
enum { PROFILES, CHOSEN, RUNNER_UP, SCORERS, CHOSEN_TERMS, RUNNER_TERMS, CONSTANT, METRICS_AGE, STALE, MISSING, KV,
       KV_AGE, TOKENS, PREFIX, CANDIDATES, FLOW_WAIT, FIELDS };

#define TRY(call)                                                                                                  \
    do {                                                                                                           \
        int rc_ = (call);                                                                                          \
        if (rc_ != 0) {                                                                                            \
            rc = rc_;                                                                                              \
            goto end;                                                                                              \
        }                                                                                                          \
    } while (0)

/* {"name":value,...} of the first element (a str) of each tuple in `items` and the value `put_value` writes */
static int
put_named(Out *o, PyObject *items, int (*put_value)(Out *, PyObject *), Py_ssize_t width)
{
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    PyObject *names[MAX_TERMS];
    if (n > MAX_TERMS)
        return 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(items, i);
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != width)
            return 1;
        names[i] = PyTuple_GET_ITEM(item, 0);
        if (!PyUnicode_CheckExact(names[i]))
            return 1;
    }
    if (!distinct(names, n))
        return 1;
    int rc = PUT(o, "{");
    for (Py_ssize_t i = 0; i < n && rc == 0; i++) {
        if (i)
            rc = PUT(o, ",");
        if (rc == 0)
            rc = put_str(o, names[i]);
        if (rc == 0)
            rc = PUT(o, ":");
        if (rc == 0)
            rc = put_value(o, PyTuple_GET_ITEM(items, i));
    }
    return rc != 0 ? rc : PUT(o, "}");
}

static int
put_mode(Out *o, PyObject *kv) /* (name, mode, stale, absent) → mode */
{
    return put_str(o, PyTuple_GET_ITEM(kv, 1));
}

static int
put_token_mode(Out *o, PyObject *token) /* (name, exact) → "render" | "estimate" */
{
    int exact = PyObject_IsTrue(PyTuple_GET_ITEM(token, 1));
    if (exact < 0)
        return -1;
    return exact ? PUT(o, "\"render\"") : PUT(o, "\"estimate\"");
}

static PyObject *zero;

static int
put_hit(Out *o, PyObject *prefix) /* (name, first hash, reach) → reach > 0 */
{
    int hit = PyObject_RichCompareBool(PyTuple_GET_ITEM(prefix, 2), zero, Py_GT);
    if (hit < 0)
        return -1;
    return hit ? PUT(o, "true") : PUT(o, "false");
}

static int
put_age(Out *o, PyObject *age) /* _age: a float below inf, else null (orjson writes NaN and -inf as null too) */
{
    return put_float(o, age);
}

/* receipt_json(receipt) -> str | NotImplemented: `Receipt.json_python`'s text */
static PyObject *
receipt_json(PyObject *self, PyObject *receipt)
{
    (void)self;
    if (!PyTuple_Check(receipt) || PyTuple_GET_SIZE(receipt) != FIELDS)
        return Py_NewRef(Py_NotImplemented);
    PyObject *const *f = &PyTuple_GET_ITEM(receipt, 0);
    for (int i = PROFILES; i <= RUNNER_TERMS; i++)
        if ((i == CHOSEN || i == RUNNER_UP) ? !PyUnicode_CheckExact(f[i]) : !PyTuple_CheckExact(f[i]))
            return Py_NewRef(Py_NotImplemented);
    if (!PyTuple_CheckExact(f[KV]) || !PyTuple_CheckExact(f[TOKENS]) || !PyTuple_CheckExact(f[PREFIX]))
        return Py_NewRef(Py_NotImplemented);
    PyObject *scorers = f[SCORERS], *chosen = f[CHOSEN_TERMS], *runner = f[RUNNER_TERMS];
    Py_ssize_t k = PyTuple_GET_SIZE(chosen);
    int paired = PyTuple_GET_SIZE(runner) > 0;
    if (PyTuple_GET_SIZE(scorers) != k || (paired && PyTuple_GET_SIZE(runner) != k) || k > MAX_TERMS)
        return Py_NewRef(Py_NotImplemented); /* zip(strict=True) raises: the Python code says so */
    if (scorers != distinct_scorers) { /* a reader's scorers are the same tuple receipt after receipt */
        if (!distinct(&PyTuple_GET_ITEM(scorers, 0), k))
            return Py_NewRef(Py_NotImplemented);
        Py_XSETREF(distinct_scorers, Py_NewRef(scorers)); /* held: its address is not another tuple's meanwhile */
    }
    Out o;
    o.buf = o.small;
    o.len = 0;
    o.cap = sizeof o.small;
    o.ascii = 1;
    int rc = 0;
    TRY(PUT(&o, "{\"profiles\":["));
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(f[PROFILES]); i++) {
        if (i)
            TRY(PUT(&o, ","));
        TRY(put_str(&o, PyTuple_GET_ITEM(f[PROFILES], i)));
    }
    TRY(PUT(&o, "],\"chosen\":"));
    TRY(put_str(&o, f[CHOSEN]));
    TRY(PUT(&o, ",\"runnerUp\":"));
    TRY(PyUnicode_GET_LENGTH(f[RUNNER_UP]) ? put_str(&o, f[RUNNER_UP]) : PUT(&o, "null"));
    TRY(PUT(&o, ",\"scorers\":{"));
    for (Py_ssize_t i = 0; i < k; i++) {
        if (i)
            TRY(PUT(&o, ","));
        TRY(put_str(&o, PyTuple_GET_ITEM(scorers, i)));
        TRY(PUT(&o, ":["));
        TRY(put_float(&o, PyTuple_GET_ITEM(chosen, i)));
        TRY(PUT(&o, ","));
        TRY(paired ? put_float(&o, PyTuple_GET_ITEM(runner, i)) : PUT(&o, "null"));
        TRY(PUT(&o, "]"));
    }
    TRY(PUT(&o, "},\"metricsAgeS\":"));
    TRY(put_age(&o, f[METRICS_AGE]));
    if (PyTuple_GET_SIZE(f[KV])) {
        TRY(PUT(&o, ",\"prefix\":"));
        TRY(put_named(&o, f[KV], put_mode, 4));
        TRY(PUT(&o, ",\"kvEventsAgeS\":"));
        TRY(put_age(&o, f[KV_AGE]));
    }
    if (PyTuple_GET_SIZE(f[TOKENS])) {
        TRY(PUT(&o, ",\"tokens\":"));
        TRY(put_named(&o, f[TOKENS], put_token_mode, 2));
    }
    if (PyTuple_GET_SIZE(f[PREFIX])) {
        TRY(PUT(&o, ",\"prefixHit\":"));
        TRY(put_named(&o, f[PREFIX], put_hit, 3));
    }
    if (!PyFloat_CheckExact(f[FLOW_WAIT])) {
        rc = 1;
        goto end;
    }
    if (PyFloat_AS_DOUBLE(f[FLOW_WAIT]) != 0.0) { /* NaN is true, as `if self.flow_wait_s` has it */
        TRY(PUT(&o, ",\"flowWaitS\":"));
        TRY(put_float(&o, f[FLOW_WAIT]));
    }
    TRY(PUT(&o, "}"));
end:;
    PyObject *result;
    if (rc == 0 && o.ascii) {
        result = PyUnicode_New(o.len, 127);
        if (result != NULL)
            memcpy(PyUnicode_DATA(result), o.buf, o.len);
    } else
        result = rc == 0 ? PyUnicode_DecodeUTF8(o.buf, o.len, NULL) : rc > 0 ? Py_NewRef(Py_NotImplemented) : NULL;
    if (o.buf != o.small)
        PyMem_Free(o.buf);
    return result;
}

/* account(Receipt, profiles, addresses, scorers, scored, total, primary, named, rows, scraped_at, failures,
 *         candidates, now, staleness_s, max_failures, kv, kv_age, tokens, scratch, lookups, flow_wait, json, pairs)
 *     -> (Receipt, str | None | NotImplemented, pairs | () | NotImplemented) | NotImplemented
 *
 * `ReceiptReader.account_python` in one call: `receipt_of`'s receipt, whose prefix field is read from the pick's
 * `scratch` (a dict) by `lookups`, a tuple of (plugin, scratch key) (the `lookup` of those plugins is
 * `state.scratch.get(key)`: (hashes, matched, reach) when it ran, the field's (plugin, hashes[0] or 0, reach)); with
 * `json` true its text (`receipt_json`; NotImplemented: the Python code writes it), else None; with `pairs` true
 * the scored endpoints' `scored_pairs` (() when `scored` is None; NotImplemented: the Python code), else (). A
 * lookup's value of another shape answers NotImplemented. */
static PyObject *
account(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 23) {
        PyErr_SetString(PyExc_TypeError, "account takes 23 arguments (receipt.py's ReceiptReader.account)");
        return NULL;
    }
    PyObject *scratch = args[18], *lookups = args[19];
    if (!PyDict_CheckExact(scratch) || !PyTuple_CheckExact(lookups))
        return Py_NewRef(Py_NotImplemented);
    Py_ssize_t n = PyTuple_GET_SIZE(lookups);
    PyObject *prefix = PyTuple_New(n);
    if (prefix == NULL)
        return NULL;
    Py_ssize_t found_count = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *lookup = PyTuple_GET_ITEM(lookups, i);
        if (!PyTuple_CheckExact(lookup) || PyTuple_GET_SIZE(lookup) != 2)
            goto other;
        PyObject *found = PyDict_GetItemWithError(scratch, PyTuple_GET_ITEM(lookup, 1));
        if (found == NULL) {
            if (PyErr_Occurred()) {
                Py_DECREF(prefix);
                return NULL;
            }
            continue;
        }
        if (!PyTuple_CheckExact(found) || PyTuple_GET_SIZE(found) != 3 || !PyList_CheckExact(PyTuple_GET_ITEM(found, 0)))
            goto other;
        PyObject *hashes = PyTuple_GET_ITEM(found, 0);
        PyObject *first = PyList_GET_SIZE(hashes) ? PyList_GET_ITEM(hashes, 0) : zero;
        PyObject *entry = PyTuple_Pack(3, PyTuple_GET_ITEM(lookup, 0), first, PyTuple_GET_ITEM(found, 2));
        if (entry == NULL) {
            Py_DECREF(prefix);
            return NULL;
        }
        PyTuple_SET_ITEM(prefix, found_count++, entry);
    }
    if (found_count < n && _PyTuple_Resize(&prefix, found_count) < 0)
        return NULL;
    PyObject *read_args[20];
    for (int i = 0; i < 18; i++)
        read_args[i] = args[i];
    read_args[18] = prefix;
    read_args[19] = args[20];
    PyObject *receipt = receipt_of(self, read_args, 20);
    Py_DECREF(prefix);
    if (receipt == NULL || receipt == Py_NotImplemented)
        return receipt;
    int json = PyObject_IsTrue(args[21]);
    PyObject *text = json < 0 ? NULL : json ? receipt_json(self, receipt) : Py_NewRef(Py_None);
    if (text == NULL) {
        Py_DECREF(receipt);
        return NULL;
    }
    int want_pairs = PyObject_IsTrue(args[22]);
    PyObject *pairs = NULL;
    if (want_pairs > 0 && args[4] != Py_None) {
        PyObject *pair_args[3] = {args[2], args[4], args[5]};
        pairs = scored_pairs(self, pair_args, 3);
    } else if (want_pairs >= 0)
        pairs = PyTuple_New(0);
    PyObject *result = pairs != NULL ? PyTuple_Pack(3, receipt, text, pairs) : NULL;
    Py_DECREF(receipt);
    Py_DECREF(text);
    Py_XDECREF(pairs);
    return result;
other:
    Py_DECREF(prefix);
    return Py_NewRef(Py_NotImplemented);
}

/* The plan of `account_pick`: what one director's receipts are read with, and its caches (a list, by these
 * positions: epp.scheduling.receipt.AccountPlan builds it). */
enum {
    PLAN_RECEIPT,     /* the Receipt type */
    PLAN_PROFILES,    /* the reader's (profile,) */
    PLAN_SCORERS,     /* the reader's weighted scorers */
    PLAN_LOOKUPS,     /* (plugin, scratch key) of its prefix lookups */
    PLAN_KEYS,        /* the scratch keys of a detailed pick's detail: (SCORED, TERMS, BUFFERS) (pick_detail.py) */
    PLAN_JSON,        /* bool: the receipt's JSON wanted */
    PLAN_PAIRS,       /* bool: the scores' pairs wanted */
    PLAN_HELD,        /* the sink's list of receipts not yet folded, or None */
    PLAN_FOLD_EVERY,  /* int: the length at which the sink folds them */
    PLAN_SINK,        /* bool: a sink takes every receipt */
    PLAN_ENTRIES,     /* (scores key, receipt key): the pairs and the JSON as `envoy.lb` entries' bytes; None: not */
    PLAN_SNAPSHOT,    /* the snapshot the next four were read from (None: none yet) */
    PLAN_SCRAPED,     /* its scraped_at as a memoryview */
    PLAN_FAILURES,    /* its scrape_failures as a memoryview */
    PLAN_SLOTS,       /* its slot_index */
    PLAN_SLOTS_VIEW,  /* … as a memoryview */
    PLAN_TOTAL,       /* the last pick's totals array (a random pick's are the same array pick after pick) */
    PLAN_TOTAL_VIEW,  /* … as a memoryview */
    PLAN_ADDRESSES,   /* the snapshot's addresses (a frozen dataclass's field: read with its columns) */
    PLAN_FRESHNESS,   /* the freshness the next two were read from (a frozen dataclass; None: none yet) */
    PLAN_STALENESS,   /* its staleness_s */
    PLAN_MAX_FAILURES, /* its max_failures */
    PLAN_SIZE
};

static PyObject *a_snapshot, *a_scratch, *a_candidates, *a_now, *a_freshness, *a_staleness_s, *a_max_failures,
    *a_addresses, *a_scraped_at, *a_scrape_failures, *a_slot_index, *a_data,
    *empty_tuple, *empty_list, *nan_float;

static int
plan_columns(PyObject *plan, PyObject *snapshot) /* the snapshot's columns and slots into the plan's caches */
{
    PyObject *got[5] = {NULL, NULL, NULL, NULL, NULL};
    PyObject *names[2] = {a_scraped_at, a_scrape_failures};
    for (int i = 0; i < 2; i++) {
        PyObject *column = PyObject_GetAttr(snapshot, names[i]);
        got[i] = column != NULL ? PyObject_GetAttr(column, a_data) : NULL;
        Py_XDECREF(column);
        if (got[i] == NULL)
            goto fail;
    }
    got[2] = PyObject_GetAttr(snapshot, a_slot_index); /* a Snapshot's; None of a test's stand-in without it */
    if (got[2] == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            goto fail;
        PyErr_Clear();
        got[2] = Py_NewRef(Py_None);
    }
    got[3] = got[2] == Py_None ? Py_NewRef(Py_None) : PyObject_GetAttr(got[2], a_data);
    if (got[3] == NULL || (got[4] = PyObject_GetAttr(snapshot, a_addresses)) == NULL)
        goto fail;
    PyList_SetItem(plan, PLAN_SCRAPED, got[0]); /* steals */
    PyList_SetItem(plan, PLAN_FAILURES, got[1]);
    PyList_SetItem(plan, PLAN_SLOTS, got[2]);
    PyList_SetItem(plan, PLAN_SLOTS_VIEW, got[3]);
    PyList_SetItem(plan, PLAN_ADDRESSES, got[4]);
    PyList_SetItem(plan, PLAN_SNAPSHOT, Py_NewRef(snapshot));
    return 0;
fail:
    for (int i = 0; i < 5; i++)
        Py_XDECREF(got[i]);
    return -1;
}

/* The `envoy.lb` struct's entries of a receipt (`write_metadata`'s scores struct and receipt, the destination left
 * to the answer): scores_key → {address: score} of each scored slot (none when nothing was scored), receipt_key →
 * the JSON. NotImplemented: another shape (the Python code answers). */
static PyObject *
lb_entries(PyObject *keys, PyObject *addresses, PyObject *scored, PyObject *total, PyObject *text)
{
    if (!PyTuple_CheckExact(keys) || PyTuple_GET_SIZE(keys) != 2 || !PyUnicode_CheckExact(PyTuple_GET_ITEM(keys, 0)) ||
        !PyUnicode_CheckExact(PyTuple_GET_ITEM(keys, 1)) || !PyUnicode_CheckExact(text) ||
        (!PyTuple_CheckExact(addresses) && !PyList_CheckExact(addresses)))
        return Py_NewRef(Py_NotImplemented);
    Py_ssize_t scores_klen, receipt_klen, text_len;
    const char *scores_key = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(keys, 0), &scores_klen);
    const char *receipt_key = scores_key != NULL ? PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(keys, 1), &receipt_klen) : NULL;
    const char *json = receipt_key != NULL ? PyUnicode_AsUTF8AndSize(text, &text_len) : NULL;
    if (json == NULL) {
        PyErr_Clear();
        return Py_NewRef(Py_NotImplemented);
    }
    Py_buffer slots_view, scores_view;
    Py_ssize_t n = 0;
    int have = scored != Py_None;
    if (have) {
        int got = buffer_of(scored, &slots_view, "lq");
        if (got != 0)
            return got < 0 ? NULL : Py_NewRef(Py_NotImplemented);
        got = buffer_of(total, &scores_view, "d");
        if (got != 0) {
            PyBuffer_Release(&slots_view);
            return got < 0 ? NULL : Py_NewRef(Py_NotImplemented);
        }
        n = slots_view.len / 8;
    }
    PyObject *result = NULL;
    const int64_t *slots = have ? (const int64_t *)slots_view.buf : NULL;
    Py_ssize_t size = PySequence_Fast_GET_SIZE(addresses);
    PyObject **items = PySequence_Fast_ITEMS(addresses);
    const char *names[64];
    Py_ssize_t lens[64];
    if (n > 64 || (have && scores_view.len != slots_view.len)) {
        result = Py_NewRef(Py_NotImplemented);
        goto done;
    }
    Py_ssize_t scores_struct = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (slots[i] < 0 || slots[i] >= size || !PyUnicode_CheckExact(items[slots[i]]) ||
            (names[i] = PyUnicode_AsUTF8AndSize(items[slots[i]], &lens[i])) == NULL) {
            PyErr_Clear();
            result = Py_NewRef(Py_NotImplemented);
            goto done;
        }
        scores_struct += number_entry_size(lens[i]);
    }
    Py_ssize_t scores_value = delimited(scores_struct);
    Py_ssize_t total_len = (n ? delimited(entry_body(scores_klen, scores_value)) : 0) +
                           (text_len ? delimited(entry_body(receipt_klen, delimited(text_len))) : 0);
    result = PyBytes_FromStringAndSize(NULL, total_len);
    if (result == NULL)
        goto done;
    char *w = PyBytes_AS_STRING(result);
    if (n) {
        const double *values = (const double *)scores_view.buf;
        w = put_struct_entry_head(w, scores_key, scores_klen, scores_struct);
        for (Py_ssize_t i = 0; i < n; i++)
            w = put_number_entry(w, names[i], lens[i], values[i]);
    }
    if (text_len)
        w = put_string_entry(w, receipt_key, receipt_klen, json, text_len);
    if (w != PyBytes_AS_STRING(result) + total_len) {
        Py_CLEAR(result);
        PyErr_SetString(PyExc_SystemError, "lb_entries: sizes and bytes written differ");
    }
done:
    if (have) {
        PyBuffer_Release(&slots_view);
        PyBuffer_Release(&scores_view);
    }
    return result;
}

/* account_pick(plan, state, primary, flow_wait_s, profiles, keep)
 *     -> (text, pairs) | (Receipt, text, pairs) | NotImplemented
 *
 * `ReceiptReader.account` and the director's hand-off to its sink in one call from `decide`: the pick's state read
 * here (its snapshot's columns as the plan's cached memoryviews, the detail under the pick_detail keys), then
 * `account`'s receipt, JSON and pairs (profiles: the receipt's, None: the reader's). When no one else needs the
 * receipt (not `keep`: the watch's sample or the log's; a sink that holds it until its fold, short of the fold)
 * it is appended to the sink's held receipts here, which is all `ReceiptMetrics.receipt` does then, and only
 * (text, pairs) come back; else (Receipt, text, pairs), nothing appended. With the plan's entry keys (receipts
 * emitted), the pairs' place holds the `envoy.lb` entries the answer writes (`lb_entries`: the scores struct and the
 * JSON as bytes; no pair made, the answer's call copies them). NotImplemented: the Python code runs
 * (`Director._account`). */
static PyObject *
account_pick(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "account_pick takes plan, state, primary, flow_wait_s, profiles, keep");
        return NULL;
    }
    PyObject *plan = args[0], *state = args[1];
    if (!PyList_CheckExact(plan) || PyList_GET_SIZE(plan) != PLAN_SIZE)
        return Py_NewRef(Py_NotImplemented);
    PyObject *const *p = &PyList_GET_ITEM(plan, 0);
    if (!PyTuple_CheckExact(p[PLAN_KEYS]) || PyTuple_GET_SIZE(p[PLAN_KEYS]) != 3)
        return Py_NewRef(Py_NotImplemented);
    PyObject *k_scored = PyTuple_GET_ITEM(p[PLAN_KEYS], 0), *k_terms = PyTuple_GET_ITEM(p[PLAN_KEYS], 1),
             *k_buffers = PyTuple_GET_ITEM(p[PLAN_KEYS], 2);
    PyObject *snapshot = NULL, *scratch = NULL, *candidates = NULL, *now = NULL, *freshness = NULL;
    PyObject *got = NULL, *result = NULL;
    if ((snapshot = PyObject_GetAttr(state, a_snapshot)) == NULL || (scratch = PyObject_GetAttr(state, a_scratch)) == NULL ||
        (candidates = PyObject_GetAttr(state, a_candidates)) == NULL || (now = PyObject_GetAttr(state, a_now)) == NULL ||
        (freshness = PyObject_GetAttr(state, a_freshness)) == NULL)
        goto done;
    if (!PyDict_CheckExact(scratch)) {
        result = Py_NewRef(Py_NotImplemented);
        goto done;
    }
    if (snapshot != p[PLAN_SNAPSHOT]) {
        if (plan_columns(plan, snapshot) < 0)
            goto done;
        p = &PyList_GET_ITEM(plan, 0);
    }
    if (freshness != p[PLAN_FRESHNESS]) { /* the profile's, the same object pick after pick */
        PyObject *staleness = PyObject_GetAttr(freshness, a_staleness_s);
        PyObject *max_failures = staleness != NULL ? PyObject_GetAttr(freshness, a_max_failures) : NULL;
        if (max_failures == NULL) {
            Py_XDECREF(staleness);
            goto done;
        }
        PyList_SetItem(plan, PLAN_STALENESS, staleness); /* steals */
        PyList_SetItem(plan, PLAN_MAX_FAILURES, max_failures);
        PyList_SetItem(plan, PLAN_FRESHNESS, Py_NewRef(freshness));
        p = &PyList_GET_ITEM(plan, 0);
    }
    PyObject *addresses = p[PLAN_ADDRESSES], *staleness = p[PLAN_STALENESS], *max_failures = p[PLAN_MAX_FAILURES];
    PyObject *terms = PyDict_GetItemWithError(scratch, k_terms);
    if (terms == NULL && PyErr_Occurred())
        goto done;
    PyObject *named = empty_list, *rows = Py_None, *scored = Py_None, *total = Py_None;
    if (terms != NULL) {
        if (!PyTuple_CheckExact(terms) || PyTuple_GET_SIZE(terms) != 2) {
            result = Py_NewRef(Py_NotImplemented);
            goto done;
        }
        named = PyTuple_GET_ITEM(terms, 0);
        rows = PyTuple_GET_ITEM(terms, 1);
    }
    PyObject *buffers = PyDict_GetItemWithError(scratch, k_buffers);
    if (buffers == NULL && PyErr_Occurred())
        goto done;
    PyObject *total_view = NULL; /* a new memoryview of `total`, kept in the plan */
    if (buffers != NULL) {
        if (!PyTuple_CheckExact(buffers) || PyTuple_GET_SIZE(buffers) != 3) {
            result = Py_NewRef(Py_NotImplemented);
            goto done;
        }
        scored = PyTuple_GET_ITEM(buffers, 0);
        total = PyTuple_GET_ITEM(buffers, 1);
        rows = PyTuple_GET_ITEM(buffers, 2);
    } else {
        PyObject *pair = PyDict_GetItemWithError(scratch, k_scored);
        if (pair == NULL && PyErr_Occurred())
            goto done;
        if (pair != NULL) {
            if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) {
                result = Py_NewRef(Py_NotImplemented);
                goto done;
            }
            scored = PyTuple_GET_ITEM(pair, 0);
            total = PyTuple_GET_ITEM(pair, 1);
            if (scored == p[PLAN_SLOTS] && scored != Py_None) /* every slot scored (a random pick's) */
                scored = p[PLAN_SLOTS_VIEW];
            if (total == p[PLAN_TOTAL] && total != Py_None) {
                total = p[PLAN_TOTAL_VIEW];
            } else if (total != Py_None) {
                total_view = PyMemoryView_FromObject(total);
                if (total_view == NULL)
                    goto done;
                PyList_SetItem(plan, PLAN_TOTAL, Py_NewRef(total));
                PyList_SetItem(plan, PLAN_TOTAL_VIEW, total_view); /* steals; the plan holds it */
                p = &PyList_GET_ITEM(plan, 0);
                total = total_view;
            }
        }
    }
    PyObject *fields[23] = {
        p[PLAN_RECEIPT], args[4] == Py_None ? p[PLAN_PROFILES] : args[4], addresses, p[PLAN_SCORERS], scored, total,
        args[2], named, rows, p[PLAN_SCRAPED], p[PLAN_FAILURES],
        candidates == p[PLAN_SLOTS] ? p[PLAN_SLOTS_VIEW] : candidates, now, staleness, max_failures, empty_tuple,
        nan_float, empty_tuple, scratch, p[PLAN_LOOKUPS], args[3], p[PLAN_JSON],
        p[PLAN_ENTRIES] != Py_None ? Py_False : p[PLAN_PAIRS],
    };
    got = account(self, fields, 23);
    if (got == NULL || got == Py_NotImplemented) {
        result = got;
        got = NULL;
        goto done;
    }
    PyObject *receipt = PyTuple_GET_ITEM(got, 0), *text = PyTuple_GET_ITEM(got, 1), *pairs = PyTuple_GET_ITEM(got, 2);
    if ((p[PLAN_JSON] == Py_True && !PyUnicode_CheckExact(text)) || !PyTuple_CheckExact(pairs)) {
        result = Py_NewRef(Py_NotImplemented);
        goto done;
    }
    if (p[PLAN_ENTRIES] != Py_None) { /* the pairs and the JSON as the answer's entries, in place of the pairs */
        PyObject *entries = lb_entries(p[PLAN_ENTRIES], addresses, scored, total, text);
        if (entries == NULL || entries == Py_NotImplemented) {
            result = entries;
            goto done;
        }
        PyObject *replaced = PyTuple_Pack(3, receipt, text, entries);
        Py_DECREF(entries);
        if (replaced == NULL)
            goto done;
        Py_SETREF(got, replaced);
        receipt = PyTuple_GET_ITEM(got, 0);
        pairs = PyTuple_GET_ITEM(got, 2);
    }
    int keep = PyObject_IsTrue(args[5]);
    if (keep < 0)
        goto done;
    PyObject *held = p[PLAN_HELD];
    if (!keep && p[PLAN_SINK] == Py_True) {
        /* the sink's `receipt` appends, and folds at FOLD_EVERY: short of it, the append is all it does */
        if (!PyList_CheckExact(held) || !PyLong_CheckExact(p[PLAN_FOLD_EVERY]) ||
            PyList_GET_SIZE(held) + 1 >= PyLong_AsSsize_t(p[PLAN_FOLD_EVERY]))
            keep = 1;
        else if (PyList_Append(held, receipt) < 0)
            goto done;
    }
    result = keep ? Py_NewRef(got) : PyTuple_Pack(2, text, pairs);
done:
    Py_XDECREF(snapshot);
    Py_XDECREF(scratch);
    Py_XDECREF(candidates);
    Py_XDECREF(now);
    Py_XDECREF(freshness);
    Py_XDECREF(got);
    return result;
}

/* -- the receipts' fold (epp.app.receipt_metrics.ReceiptMetrics._fold_python) --------------------------------- */

static PyObject *s_precise, *s_approximate, *s_render, *s_estimate, *s_hit, *s_miss;

static int
floats_of(PyObject *t, Py_ssize_t width) /* an exact tuple of `width` exact floats */
{
    if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != width)
        return 0;
    for (Py_ssize_t i = 0; i < width; i++)
        if (!PyFloat_CheckExact(PyTuple_GET_ITEM(t, i)))
            return 0;
    return 1;
}

static int
entries_of(PyObject *t, Py_ssize_t width) /* an exact tuple of exact tuples of `width`, each a str first */
{
    if (!PyTuple_CheckExact(t))
        return 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(t); i++) {
        PyObject *e = PyTuple_GET_ITEM(t, i);
        if (!PyTuple_CheckExact(e) || PyTuple_GET_SIZE(e) != width || !PyUnicode_CheckExact(PyTuple_GET_ITEM(e, 0)))
            return 0;
    }
    return 1;
}

static int
count_mode(PyObject *modes, PyObject *name, PyObject *mode, long long k) /* modes[(name, mode)] += k */
{
    PyObject *key = PyTuple_Pack(2, name, mode);
    if (key == NULL)
        return -1;
    PyObject *old = PyDict_GetItemWithError(modes, key);
    long long n = 0;
    if (old != NULL) {
        n = PyLong_Check(old) ? PyLong_AsLongLong(old) : -1;
        if (n == -1 && (PyErr_Occurred() || !PyLong_Check(old))) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "a mode's count is not an int");
            Py_DECREF(key);
            return -1;
        }
    } else if (PyErr_Occurred()) {
        Py_DECREF(key);
        return -1;
    }
    PyObject *value = PyLong_FromLongLong(n + k);
    int rc = value == NULL ? -1 : PyDict_SetItem(modes, key, value);
    Py_XDECREF(value);
    Py_DECREF(key);
    return rc;
}

static int
add_to(PyObject *sums, PyObject *name, double x) /* sums[name] = sums.get(name, 0.0) + x */
{
    PyObject *old = PyDict_GetItemWithError(sums, name);
    double base = 0.0;
    if (old != NULL) {
        base = PyFloat_AsDouble(old);
        if (base == -1.0 && PyErr_Occurred())
            return -1;
    } else if (PyErr_Occurred())
        return -1;
    PyObject *value = PyFloat_FromDouble(base + x);
    int rc = value == NULL ? -1 : PyDict_SetItem(sums, name, value);
    Py_XDECREF(value);
    return rc;
}

#define MAX_BUCKETS 64
#define TALLIES 32

/* A batch's modes counted by (name, mode) objects first, then into the dict once each (a key's tuple, hash and
 * dict write per receipt cost ~1.1k instructions): the same counts (the dict's order is not read: the metrics'
 * families sort it). Equal names of two objects are two tallies of one key, added both. */
typedef struct {
    PyObject *name[TALLIES], *mode[TALLIES];
    long long n[TALLIES];
    int used;
} Tally;

static int
tally(Tally *t, PyObject *modes, PyObject *name, PyObject *mode)
{
    for (int i = 0; i < t->used; i++)
        if (t->name[i] == name && t->mode[i] == mode) {
            t->n[i]++;
            return 0;
        }
    if (t->used == TALLIES) /* full: straight into the dict */
        return count_mode(modes, name, mode, 1);
    t->name[t->used] = name;
    t->mode[t->used] = mode;
    t->n[t->used++] = 1;
    return 0;
}

static Py_ssize_t
bucket_of(const double *bounds, Py_ssize_t n, double x) /* bisect_left */
{
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (bounds[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int
add_counts(PyObject *counts, const long long *deltas, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!deltas[i])
            continue;
        long long was = PyLong_AsLongLong(PyList_GET_ITEM(counts, i));
        if (was == -1 && PyErr_Occurred())
            return -1;
        PyObject *value = PyLong_FromLongLong(was + deltas[i]);
        if (value == NULL)
            return -1;
        PyList_SetItem(counts, i, value);
    }
    return 0;
}

/* fold(raw, contribution, margin, modes, bounds, metrics_counts, kv_counts, metrics_sum, kv_sum)
 *     -> (metrics_sum, kv_sum) | NotImplemented
 *
 * `ReceiptMetrics._fold_python` of the receipts `raw` (a list) into its dicts and its two histograms' bucket
 * counts (lists of ints, one per bound and +Inf), their sums given and answered: the same operations in the same
 * order, so the same doubles (a term column summed over the batch from 0.0, then added; the margin as the paired
 * receipts' column sum less the runner-ups'; ages added one after another; modes counted). The usual batch only:
 * every receipt naming the same scorers, its terms one per scorer, a runner-up's too or none, fields of the types a
 * read gives; anything else answers NotImplemented before anything is written, and the Python code folds. */
static PyObject *
fold(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "fold takes raw, contribution, margin, modes, bounds, metrics_counts, "
                                         "kv_counts, metrics_sum, kv_sum");
        return NULL;
    }
    PyObject *raw = args[0], *contribution = args[1], *margin = args[2], *modes = args[3], *bounds_arg = args[4];
    PyObject *metrics_counts = args[5], *kv_counts = args[6];
    if (!PyList_CheckExact(raw) || !PyDict_CheckExact(contribution) || !PyDict_CheckExact(margin) ||
        !PyDict_CheckExact(modes) || !PyTuple_CheckExact(bounds_arg) || !PyList_CheckExact(metrics_counts) ||
        !PyList_CheckExact(kv_counts) || !PyFloat_CheckExact(args[7]) || !PyFloat_CheckExact(args[8]))
        return Py_NewRef(Py_NotImplemented);
    Py_ssize_t nb = PyTuple_GET_SIZE(bounds_arg);
    if (nb >= MAX_BUCKETS || PyList_GET_SIZE(metrics_counts) != nb + 1 || PyList_GET_SIZE(kv_counts) != nb + 1)
        return Py_NewRef(Py_NotImplemented);
    double bounds[MAX_BUCKETS];
    for (Py_ssize_t i = 0; i < nb; i++) {
        PyObject *b = PyTuple_GET_ITEM(bounds_arg, i);
        if (!PyFloat_CheckExact(b))
            return Py_NewRef(Py_NotImplemented);
        bounds[i] = PyFloat_AS_DOUBLE(b);
    }
    for (Py_ssize_t i = 0; i <= nb; i++)
        if (!PyLong_CheckExact(PyList_GET_ITEM(metrics_counts, i)) || !PyLong_CheckExact(PyList_GET_ITEM(kv_counts, i)))
            return Py_NewRef(Py_NotImplemented);
    Py_ssize_t n = PyList_GET_SIZE(raw);
    if (n == 0)
        return Py_BuildValue("(OO)", args[7], args[8]);
    /* validate first: nothing is written unless the whole batch folds here */
    PyObject *names = NULL;
    Py_ssize_t width = 0;
    int unpaired = 0, paired = 0;
    for (Py_ssize_t r = 0; r < n; r++) {
        PyObject *rc = PyList_GET_ITEM(raw, r);
        if (!PyTuple_Check(rc) || PyTuple_GET_SIZE(rc) != FIELDS)
            return Py_NewRef(Py_NotImplemented);
        PyObject *const *f = &PyTuple_GET_ITEM(rc, 0);
        if (names == NULL) {
            names = f[SCORERS];
            if (!PyTuple_CheckExact(names) || PyTuple_GET_SIZE(names) > MAX_TERMS)
                return Py_NewRef(Py_NotImplemented);
            width = PyTuple_GET_SIZE(names);
            for (Py_ssize_t t = 0; t < width; t++)
                if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(names, t)))
                    return Py_NewRef(Py_NotImplemented);
        } else if (f[SCORERS] != names) {
            int same = PyTuple_CheckExact(f[SCORERS]) ? PyObject_RichCompareBool(f[SCORERS], names, Py_EQ) : 0;
            if (same < 0)
                return NULL;
            if (!same)
                return Py_NewRef(Py_NotImplemented);
        }
        if (width) {
            if (!floats_of(f[CHOSEN_TERMS], width))
                return Py_NewRef(Py_NotImplemented);
            if (PyTuple_CheckExact(f[RUNNER_TERMS]) && PyTuple_GET_SIZE(f[RUNNER_TERMS]) == 0)
                unpaired = 1;
            else if (floats_of(f[RUNNER_TERMS], width))
                paired = 1;
            else
                return Py_NewRef(Py_NotImplemented);
        }
        if (!entries_of(f[KV], 4) || !entries_of(f[TOKENS], 2) || !entries_of(f[PREFIX], 3) ||
            !PyFloat_CheckExact(f[METRICS_AGE]) || !PyFloat_CheckExact(f[KV_AGE]))
            return Py_NewRef(Py_NotImplemented);
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(f[KV]); i++)
            if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(PyTuple_GET_ITEM(f[KV], i), 1)))
                return Py_NewRef(Py_NotImplemented);
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(f[TOKENS]); i++)
            if (!PyBool_Check(PyTuple_GET_ITEM(PyTuple_GET_ITEM(f[TOKENS], i), 1)))
                return Py_NewRef(Py_NotImplemented);
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(f[PREFIX]); i++)
            if (!PyLong_CheckExact(PyTuple_GET_ITEM(PyTuple_GET_ITEM(f[PREFIX], i), 2)))
                return Py_NewRef(Py_NotImplemented);
    }
    /* the terms: each column summed over the batch (sum(): from 0.0, one after another), then added */
    if (width) {
        double chosen[MAX_TERMS], paired_sum[MAX_TERMS], runner[MAX_TERMS];
        for (Py_ssize_t t = 0; t < width; t++)
            chosen[t] = paired_sum[t] = runner[t] = 0.0;
        for (Py_ssize_t r = 0; r < n; r++) {
            PyObject *const *f = &PyTuple_GET_ITEM(PyList_GET_ITEM(raw, r), 0);
            int has_runner = PyTuple_GET_SIZE(f[RUNNER_TERMS]) > 0;
            for (Py_ssize_t t = 0; t < width; t++) {
                double x = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(f[CHOSEN_TERMS], t));
                chosen[t] += x;
                if (has_runner) {
                    paired_sum[t] += x;
                    runner[t] += PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(f[RUNNER_TERMS], t));
                }
            }
        }
        const double *pairs = unpaired ? paired_sum : chosen; /* every receipt paired: the chosen sums themselves */
        for (Py_ssize_t t = 0; t < width; t++) {
            PyObject *name = PyTuple_GET_ITEM(names, t);
            if (add_to(contribution, name, chosen[t]) < 0)
                return NULL;
            if (paired && add_to(margin, name, pairs[t] - runner[t]) < 0)
                return NULL;
        }
    }
    /* the modes, then the ages */
    long long metrics_deltas[MAX_BUCKETS] = {0}, kv_deltas[MAX_BUCKETS] = {0};
    Tally tallied;
    tallied.used = 0;
    double metrics_sum = PyFloat_AS_DOUBLE(args[7]), kv_sum = PyFloat_AS_DOUBLE(args[8]);
    for (Py_ssize_t r = 0; r < n; r++) {
        PyObject *const *f = &PyTuple_GET_ITEM(PyList_GET_ITEM(raw, r), 0);
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(f[KV]); i++) {
            PyObject *e = PyTuple_GET_ITEM(f[KV], i);
            int precise = PyUnicode_Compare(PyTuple_GET_ITEM(e, 1), s_precise);
            if (precise == -1 && PyErr_Occurred())
                return NULL;
            if (tally(&tallied, modes, PyTuple_GET_ITEM(e, 0), precise == 0 ? s_precise : s_approximate) < 0)
                return NULL;
        }
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(f[TOKENS]); i++) {
            PyObject *e = PyTuple_GET_ITEM(f[TOKENS], i);
            if (tally(&tallied, modes, PyTuple_GET_ITEM(e, 0), PyTuple_GET_ITEM(e, 1) == Py_True ? s_render : s_estimate) < 0)
                return NULL;
        }
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(f[PREFIX]); i++) {
            PyObject *e = PyTuple_GET_ITEM(f[PREFIX], i);
            int hit = PyObject_RichCompareBool(PyTuple_GET_ITEM(e, 2), zero, Py_GT);
            if (hit < 0 || tally(&tallied, modes, PyTuple_GET_ITEM(e, 0), hit ? s_hit : s_miss) < 0)
                return NULL;
        }
        double age = PyFloat_AS_DOUBLE(f[METRICS_AGE]);
        if (age < INFINITY) {
            metrics_deltas[bucket_of(bounds, nb, age)]++;
            metrics_sum += age;
        }
        double kv_age = PyFloat_AS_DOUBLE(f[KV_AGE]);
        if (PyTuple_GET_SIZE(f[KV]) && kv_age < INFINITY) {
            kv_deltas[bucket_of(bounds, nb, kv_age)]++;
            kv_sum += kv_age;
        }
    }
    for (int i = 0; i < tallied.used; i++)
        if (count_mode(modes, tallied.name[i], tallied.mode[i], tallied.n[i]) < 0)
            return NULL;
    if (add_counts(metrics_counts, metrics_deltas, nb + 1) < 0 || add_counts(kv_counts, kv_deltas, nb + 1) < 0)
        return NULL;
    return Py_BuildValue("(dd)", metrics_sum, kv_sum);
}

static PyMethodDef methods[] = {
    {"pick_terms", (PyCFunction)(void (*)(void))pick_terms, METH_FASTCALL,
     "The runner-up and both endpoints' terms of a detailed pick (receipt.py's pick_terms_python)."},
    {"receipt_json", (PyCFunction)receipt_json, METH_O, "A receipt's JSON (receipt.py's Receipt.json_python)."},
    {"scored_pairs", (PyCFunction)(void (*)(void))scored_pairs, METH_FASTCALL,
     "(address, score) of each scored slot (receipt.py's scored_pairs_python)."},
    {"account", (PyCFunction)(void (*)(void))account, METH_FASTCALL,
     "A detailed pick's receipt and its JSON in one call (receipt.py's ReceiptReader.account_python)."},
    {"account_pick", (PyCFunction)(void (*)(void))account_pick, METH_FASTCALL,
     "A detailed pick's receipt read from its state and handed to the sink (receipt.py's AccountPlan)."},
    {"fold", (PyCFunction)(void (*)(void))fold, METH_FASTCALL,
     "A batch of receipts into the aggregates (receipt_metrics.py's ReceiptMetrics._fold_python)."},
    {"receipt_of", (PyCFunction)(void (*)(void))receipt_of, METH_FASTCALL,
     "A detailed pick's receipt in one call (receipt.py's ReceiptReader.read_python)."},
    {"signal_health", (PyCFunction)(void (*)(void))signal_health, METH_FASTCALL,
     "The primary's metrics age and the candidates' stale and missing counts (receipt.py's signal_health_python)."},
    {NULL, NULL, 0, NULL},
};

static int
setup_module(PyObject *module)
{
    (void)module;
    zero = PyLong_FromLong(0);
    empty_str = PyUnicode_FromString("");
    no_terms = Py_BuildValue("(i()()())", -1);
    s_precise = PyUnicode_InternFromString("precise");
    s_approximate = PyUnicode_InternFromString("approximate");
    s_render = PyUnicode_InternFromString("render");
    s_estimate = PyUnicode_InternFromString("estimate");
    s_hit = PyUnicode_InternFromString("hit");
    s_miss = PyUnicode_InternFromString("miss");
    const char *attrs[] = {"snapshot", "scratch", "candidates", "now", "freshness", "staleness_s", "max_failures",
                           "addresses", "scraped_at", "scrape_failures", "slot_index", "data"};
    PyObject **slots[] = {&a_snapshot, &a_scratch, &a_candidates, &a_now, &a_freshness, &a_staleness_s,
                          &a_max_failures, &a_addresses, &a_scraped_at, &a_scrape_failures, &a_slot_index, &a_data};
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++)
        if ((*slots[i] = PyUnicode_InternFromString(attrs[i])) == NULL)
            return -1;
    empty_tuple = PyTuple_New(0);
    empty_list = PyList_New(0);
    nan_float = PyFloat_FromDouble(NAN);
    if (empty_tuple == NULL || empty_list == NULL || nan_float == NULL)
        return -1;
    if (zero == NULL || empty_str == NULL || no_terms == NULL || s_precise == NULL || s_approximate == NULL ||
        s_render == NULL || s_estimate == NULL || s_hit == NULL || s_miss == NULL)
        return -1;
    PyObject *orjson = PyImport_ImportModule("orjson"); /* as receipt.py imports it */
    if (orjson == NULL)
        return -1;
    orjson_dumps = PyObject_GetAttrString(orjson, "dumps");
    Py_DECREF(orjson);
    return orjson_dumps == NULL ? -1 : 0;
}

EPP_OPTIONAL_MODULE(PyInit__receipt, "epp.scheduling._receipt",
                    "A route receipt's terms and JSON (see receipt.py).", methods, setup_module)
