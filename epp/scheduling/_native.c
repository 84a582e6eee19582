/* The profile runner's arithmetic on its candidates, compiled: the weighted total of the scorers' terms, the
 * max-score picker's tie search, the saturation filter's elementwise pass, and the prefix index's match. Built at
 * install when a compiler is there (setup.py: optional); `epp.scheduling.totals` decides at import whether these or
 * the numpy code run.
 *
 * Not definitions of their own: `weighted_total_numpy`, `max_tie_numpy` (epp/scheduling/totals.py),
 * `kept_under_numpy` (epp/scheduling/saturation.py) and `PrefixIndex.match_python` (epp/scheduling/prefix.py) are,
 * and tests/scheduling/test_totals.py (tests/scheduling/test_prefix_native.py for the match) holds the two equal on
 * random inputs (NaN, infinities, signed zeros, ties; random holder sets).
 * Every step is the numpy code's, element by element, in its order, so the results are the same doubles: a term is
 * values × coef, then (with a fill) NaN → fill and ±inf → ±DBL_MAX (`np.nan_to_num`); the total is the first term
 * plus each later one in turn, plus the offset when it is not 0, then `fmax(total, 0)`. Buffers only (the buffer
 * protocol), no numpy C API; a buffer that is not contiguous float64 answers NotImplemented (the numpy code runs).
 * EPP_NATIVE=0 in the environment at import sets ENABLED to 0. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../optional_module.h"
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_TERMS 16

static int
doubles(PyObject *o, Py_buffer *view, int writable)
{
    int flags = PyBUF_FORMAT | PyBUF_STRIDES | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(o, view, flags) < 0)
        return -1;
    if (view->itemsize != 8 || view->format == NULL || strcmp(view->format, "d") != 0 ||
        !PyBuffer_IsContiguous(view, 'C')) {
        PyBuffer_Release(view);
        return 1;
    }
    return 0;
}

/* weighted_total(out, offset, values_0, coef_0, fill_0, values_1, ...) -> None | NotImplemented
 *
 * out: n float64, written; each term's values: n float64 (read); coef: a float; fill: a float or None. More than
 * MAX_TERMS terms answer NotImplemented. `rows` (weighted_total_rows): terms × n float64, each term written into its
 * row too (a detailed pick's terms, `weighted_term` of each). */
static PyObject *
total_into(PyObject *const *args, Py_ssize_t nargs, PyObject *rows_arg)
{
    if (nargs < 5 || (nargs - 2) % 3 != 0) {
        PyErr_SetString(PyExc_TypeError, "weighted_total takes out, offset and (values, coef, fill) terms");
        return NULL;
    }
    if ((nargs - 2) / 3 > MAX_TERMS)
        return Py_NewRef(Py_NotImplemented); /* a profile of more scorers than that: the numpy code */
    Py_ssize_t terms = (nargs - 2) / 3;
    double offset = PyFloat_AsDouble(args[1]);
    if (offset == -1.0 && PyErr_Occurred())
        return NULL;
    double coef[MAX_TERMS], fill[MAX_TERMS];
    int has_fill[MAX_TERMS];
    for (Py_ssize_t t = 0; t < terms; t++) {
        coef[t] = PyFloat_AsDouble(args[3 + 3 * t]);
        if (coef[t] == -1.0 && PyErr_Occurred())
            return NULL;
        PyObject *f = args[4 + 3 * t];
        has_fill[t] = f != Py_None;
        fill[t] = has_fill[t] ? PyFloat_AsDouble(f) : 0.0;
        if (has_fill[t] && fill[t] == -1.0 && PyErr_Occurred())
            return NULL;
    }
    Py_buffer out, views[MAX_TERMS];
    int got = doubles(args[0], &out, 1);
    if (got != 0)
        return got < 0 ? NULL : Py_NewRef(Py_NotImplemented);
    PyObject *result = NULL;
    Py_ssize_t held = 0;
    Py_ssize_t n = out.len / 8;
    Py_buffer rows_view;
    double *rows = NULL;
    if (rows_arg != NULL) {
        got = doubles(rows_arg, &rows_view, 1);
        if (got != 0) {
            PyBuffer_Release(&out);
            return got < 0 ? NULL : Py_NewRef(Py_NotImplemented);
        }
        if (rows_view.len != out.len * terms) {
            PyBuffer_Release(&rows_view);
            PyBuffer_Release(&out);
            PyErr_SetString(PyExc_ValueError, "rows is not terms x len(out)");
            return NULL;
        }
        rows = (double *)rows_view.buf;
    }
    for (; held < terms; held++) {
        got = doubles(args[2 + 3 * held], &views[held], 0);
        if (got != 0) {
            result = got < 0 ? NULL : Py_NewRef(Py_NotImplemented);
            goto done;
        }
        if (views[held].len != out.len) {
            PyBuffer_Release(&views[held]);
            PyErr_SetString(PyExc_ValueError, "a term's values and out differ in length");
            goto done;
        }
    }
    double *total = (double *)out.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        double sum = 0.0;
        for (Py_ssize_t t = 0; t < terms; t++) {
            double x = ((const double *)views[t].buf)[i] * coef[t];
            if (has_fill[t]) {
                if (isnan(x))
                    x = fill[t];
                else if (isinf(x))
                    x = x > 0 ? DBL_MAX : -DBL_MAX;
            }
            if (rows != NULL)
                rows[t * n + i] = x;
            sum = t == 0 ? x : sum + x;
        }
        if (offset != 0.0)
            sum += offset;
        total[i] = sum >= 0.0 ? sum : 0.0; /* fmax(sum, 0): NaN → 0 */
    }
    result = Py_NewRef(Py_None);
done:
    for (Py_ssize_t t = 0; t < held; t++)
        PyBuffer_Release(&views[t]);
    if (rows != NULL)
        PyBuffer_Release(&rows_view);
    PyBuffer_Release(&out);
    return result;
}

static PyObject *
weighted_total(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    return total_into(args, nargs, NULL);
}

/* weighted_total_rows(out, rows, offset, values_0, coef_0, fill_0, ...) -> None | NotImplemented */
static PyObject *
weighted_total_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "weighted_total_rows takes out, rows, offset and terms");
        return NULL;
    }
    /* out, then offset and the terms: the arguments less `rows` (args[1]) */
    PyObject *shifted[2 + 3 * MAX_TERMS];
    if (nargs - 1 > 2 + 3 * MAX_TERMS)
        return Py_NewRef(Py_NotImplemented);
    shifted[0] = args[0];
    for (Py_ssize_t i = 2; i < nargs; i++)
        shifted[i - 1] = args[i];
    return total_into(shifted, nargs - 1, nargs > 1 ? args[1] : Py_None);
}

/* The max-score pick of n scores (`max_tie`'s and `fused_pick`'s one rule): the highest, ties (scores ≥ max − tie;
 * NaN is never one) broken by `draw()`, a float in [0, 1) called only when there are several: the k-th tie in index
 * order, k = int(draw() × ties). The index, or -1 with an exception set (no score; a draw outside [0, 1)). */
static Py_ssize_t
tie_choice(const double *s, Py_ssize_t n, double tie, PyObject *draw)
{
    double hi = NAN;
    for (Py_ssize_t i = 0; i < n; i++)
        if (!isnan(s[i]) && (isnan(hi) || s[i] > hi))
            hi = s[i];
    double floor = hi - tie;
    Py_ssize_t ties = 0, first = -1;
    for (Py_ssize_t i = 0; i < n; i++)
        if (s[i] >= floor && ties++ == 0)
            first = i;
    if (ties == 0) {
        PyErr_SetString(PyExc_IndexError, "no score to pick from");
        return -1;
    }
    if (ties == 1)
        return first;
    PyObject *u = PyObject_CallNoArgs(draw);
    if (u == NULL)
        return -1;
    double x = PyFloat_AsDouble(u);
    Py_DECREF(u);
    if (x == -1.0 && PyErr_Occurred())
        return -1;
    Py_ssize_t k = (Py_ssize_t)(x * (double)ties);
    if (k < 0 || k >= ties) {
        PyErr_SetString(PyExc_IndexError, "draw() outside [0, 1)");
        return -1;
    }
    for (Py_ssize_t i = first;; i++)
        if (s[i] >= floor && k-- == 0)
            return i;
}

/* max_tie(scores, tie, draw) -> int | NotImplemented
 *
 * The index of the highest score, ties (scores ≥ max − tie; NaN is never one) broken by `draw()`, a float in
 * [0, 1) called only when there are several: the k-th tie in index order, k = int(draw() × ties). */
static PyObject *
max_tie(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "max_tie takes scores, tie and draw");
        return NULL;
    }
    double tie = PyFloat_AsDouble(args[1]);
    if (tie == -1.0 && PyErr_Occurred())
        return NULL;
    Py_buffer view;
    int got = doubles(args[0], &view, 0);
    if (got != 0)
        return got < 0 ? NULL : Py_NewRef(Py_NotImplemented);
    PyObject *result = NULL;
    Py_ssize_t choice = tie_choice((const double *)view.buf, view.len / 8, tie, args[2]);
    if (choice < 0)
        goto done;
    result = PyLong_FromSsize_t(choice);
done:
    PyBuffer_Release(&view);
    return result;
}

static int
typed(PyObject *o, Py_buffer *view, const char *format, Py_ssize_t itemsize, int writable)
{
    int flags = PyBUF_FORMAT | PyBUF_STRIDES | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(o, view, flags) < 0)
        return -1;
    if (view->itemsize != itemsize || view->format == NULL || strcmp(view->format, format) != 0 ||
        !PyBuffer_IsContiguous(view, 'C')) {
        PyBuffer_Release(view);
        return 1;
    }
    return 0;
}

/* kept_under(candidates, queue, kv, fresh, queue_limit, kv_limit, out) -> int | NotImplemented
 *
 * The saturation filter's elementwise pass (saturation.py's `kept_under_numpy`): into `out` (n int64), the
 * candidates (n int64) whose data is usable (`fresh`: n bools, or None: all) and that are under both limits
 * (queue < queue_limit and kv < kv_limit, NaN counting as under: `over` is False for it), in order; returns how
 * many. */
static PyObject *
kept_under(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "kept_under takes 7 arguments");
        return NULL;
    }
    double ql = PyFloat_AsDouble(args[4]), kl = PyFloat_AsDouble(args[5]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer views[5];
    const char *formats[5] = {"l", "d", "d", "?", "l"};
    const Py_ssize_t sizes[5] = {8, 8, 8, 1, 8};
    PyObject *objects[5] = {args[0], args[1], args[2], args[3], args[6]};
    int held[5] = {0, 0, 0, 0, 0};
    PyObject *result = NULL;
    for (int b = 0; b < 5; b++) {
        if (b == 3 && objects[b] == Py_None)
            continue;
        int got = typed(objects[b], &views[b], formats[b], sizes[b], b == 4);
        if (got != 0) {
            result = got < 0 ? NULL : Py_NewRef(Py_NotImplemented);
            goto done;
        }
        held[b] = 1;
    }
    Py_ssize_t n = views[0].len / 8;
    if (views[1].len != n * 8 || views[2].len != n * 8 || (held[3] && views[3].len != n) || views[4].len < n * 8) {
        PyErr_SetString(PyExc_ValueError, "candidates, queue, kv, fresh and out differ in length");
        goto done;
    }
    const long *c = (const long *)views[0].buf;
    const double *q = (const double *)views[1].buf, *kv = (const double *)views[2].buf;
    const unsigned char *fresh = held[3] ? (const unsigned char *)views[3].buf : NULL;
    long *out = (long *)views[4].buf;
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if ((fresh == NULL || fresh[i]) && !(q[i] >= ql || kv[i] >= kl))
            out[k++] = c[i];
    result = PyLong_FromSsize_t(k);
done:
    for (int b = 0; b < 5; b++)
        if (held[b])
            PyBuffer_Release(&views[b]);
    return result;
}

/* The bits of a holder set (a Python int, `PrefixIndex._holders`' value; absent: 0) into *out; 0 when it is wider
 * than 64 bits (or not an int), -1 on a Python error. */
static int
holder_bits(PyObject *holders, PyObject *hash, uint64_t *out)
{
    PyObject *found = PyDict_GetItemWithError(holders, hash);
    if (found == NULL) {
        if (PyErr_Occurred())
            return -1;
        *out = 0;
        return 1;
    }
    if (!PyLong_CheckExact(found))
        return 0;
    uint64_t bits = PyLong_AsUnsignedLongLong(found);
    if (bits == (uint64_t)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    *out = bits;
    return 1;
}

/* holds_all(young, hashes) -> bool
 *
 * prefix.py's `young.issuperset(hashes)` in `PrefixIndex.holds_young`, for a set and a list: each hash looked up
 * in the set, stopping at the first it lacks. CPython 3.11's issuperset of a list builds a set of it first: ~3.7k
 * instructions for 11 hashes, where the lookups alone take ~0.9k. */
static PyObject *
holds_all(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 2 || !PyAnySet_Check(args[0]) || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "holds_all takes a set and a list");
        return NULL;
    }
    PyObject *young = args[0], *hashes = args[1];
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(hashes); i++) {
        int held = PySet_Contains(young, PyList_GET_ITEM(hashes, i));
        if (held < 0)
            return NULL;
        if (!held)
            Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

/* prefix_match(holders, hashes, out) -> int | NotImplemented
 *
 * The prefix index's match (prefix.py's `PrefixIndex.match_python`, step for step): into `out` (n float64, zeros),
 * per slot the leading blocks of `hashes` (a list of ints) it holds, each run of equal holder sets found by binary
 * search; returns the depth of the longest match (`reach`). A holder set wider than 64 bits (a table of more than 64
 * slots) answers NotImplemented before `out` is written. */
static PyObject *
prefix_match(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3 || !PyDict_Check(args[0]) || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "prefix_match takes holders (a dict), hashes (a list) and out");
        return NULL;
    }
    PyObject *holders = args[0], *hashes = args[1];
    Py_ssize_t n = PyList_GET_SIZE(hashes);
    uint64_t current = 0, got;
    Py_ssize_t depth = 0, segments = 0;
    Py_ssize_t seg_depth[65];
    uint64_t seg_mask[65];
    int rc;
    if (n) {
        if ((rc = holder_bits(holders, PyList_GET_ITEM(hashes, 0), &current)) <= 0)
            return rc < 0 ? NULL : Py_NewRef(Py_NotImplemented);
    }
    while (current) {
        Py_ssize_t lo = depth, hi = n - 1;
        while (lo < hi) {
            Py_ssize_t mid = (lo + hi + 1) >> 1;
            if ((rc = holder_bits(holders, PyList_GET_ITEM(hashes, mid), &got)) <= 0)
                return rc < 0 ? NULL : Py_NewRef(Py_NotImplemented);
            if (got == current)
                lo = mid;
            else
                hi = mid - 1;
        }
        depth = lo + 1;
        uint64_t deeper = 0;
        if (depth < n) {
            if ((rc = holder_bits(holders, PyList_GET_ITEM(hashes, depth), &got)) <= 0)
                return rc < 0 ? NULL : Py_NewRef(Py_NotImplemented);
            deeper = got & current;
        }
        if (segments == 65) /* a strictly shrinking set has at most 64 runs: an index out of its invariant */
            return Py_NewRef(Py_NotImplemented);
        seg_depth[segments] = depth;
        seg_mask[segments++] = current & ~deeper;
        current = deeper;
    }
    Py_buffer view;
    int ok = doubles(args[2], &view, 1);
    if (ok != 0)
        return ok < 0 ? NULL : Py_NewRef(Py_NotImplemented);
    Py_ssize_t size = view.len / 8;
    double *out = (double *)view.buf;
    for (Py_ssize_t s = 0; s < segments; s++) {
        uint64_t mask = seg_mask[s];
        if (size < 64)
            mask &= ((uint64_t)1 << size) - 1; /* slots beyond this snapshot: the index is ahead of it */
        while (mask) {
            out[__builtin_ctzll(mask)] = (double)seg_depth[s];
            mask &= mask - 1;
        }
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(depth);
}

/* (lo, hi, False), the references taken; NULL when either is. */
static PyObject *
known(PyObject *lo, PyObject *hi)
{
    PyObject *tuple = lo != NULL && hi != NULL ? PyTuple_New(3) : NULL;
    if (tuple == NULL) {
        Py_XDECREF(lo);
        Py_XDECREF(hi);
        return NULL;
    }
    PyTuple_SET_ITEM(tuple, 0, lo);
    PyTuple_SET_ITEM(tuple, 1, hi);
    PyTuple_SET_ITEM(tuple, 2, Py_NewRef(Py_False));
    return tuple;
}

/* small_extremes(values) -> (lo, hi, False) | NotImplemented
 *
 * `framework.small_extremes`' answer for an array of known values (framework.py, step for step): for a contiguous
 * float64 or int64 buffer of 1..32 values whose sum (float64, in order from 0.0, as Python's `sum` of a list of
 * floats adds) is not NaN, the first least and the first greatest value as Python's `min` and `max` of the list
 * find them (`<` and `>`), as Python floats or ints. Anything else (empty, NaN in the sum, another type, longer)
 * answers NotImplemented and the Python code runs. */
static PyObject *
small_extremes(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_FORMAT | PyBUF_STRIDES) < 0)
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = view.itemsize ? view.len / view.itemsize : 0;
    if (view.itemsize != 8 || view.format == NULL || n < 1 || n > 32 || !PyBuffer_IsContiguous(&view, 'C')) {
        result = Py_NewRef(Py_NotImplemented);
    } else if (strcmp(view.format, "d") == 0) {
        const double *x = (const double *)view.buf;
        double sum = 0.0, lo = x[0], hi = x[0];
        for (Py_ssize_t i = 0; i < n; i++) {
            sum += x[i];
            if (x[i] < lo)
                lo = x[i];
            if (x[i] > hi)
                hi = x[i];
        }
        result = isnan(sum) ? Py_NewRef(Py_NotImplemented) : known(PyFloat_FromDouble(lo), PyFloat_FromDouble(hi));
    } else if (strcmp(view.format, "l") == 0 || strcmp(view.format, "q") == 0) {
        const int64_t *x = (const int64_t *)view.buf;
        int64_t lo = x[0], hi = x[0];
        for (Py_ssize_t i = 1; i < n; i++) {
            if (x[i] < lo)
                lo = x[i];
            if (x[i] > hi)
                hi = x[i];
        }
        result = known(PyLong_FromLongLong(lo), PyLong_FromLongLong(hi));
    } else {
        result = Py_NewRef(Py_NotImplemented);
    }
    PyBuffer_Release(&view);
    return result;
}

/* ---- The default profile in one call (epp/scheduling/fused.py): not a definition either. The plugins are
 * (saturation.py's SaturationFilter, scorers.py's QueueScorer, KvCacheUtilizationScorer and InflightLoadScorer,
 * prefix.py's PrefixCacheScorer, pickers.py's MaxScorePicker, profile.py's runner), and
 * tests/scheduling/test_fused.py holds the two equal. Every step is theirs, in their order. */

#define FUSED_MAX 32 /* framework.SMALL_POOL: larger pools run the plugins */

/* `framework.extremes` of n doubles (n ≥ 1): (lo, hi) of the known values (NaN, NaN when none), *unknown set when
 * a value is NaN. Without a NaN: the first least and greatest (Python's min and max of the list); with one: fmin
 * and fmax over the known values (numpy's NaN-ignoring reductions). */
static void
fused_extremes(const double *x, Py_ssize_t n, double *lo, double *hi, int *unknown)
{
    int nan = 0;
    double l = NAN, h = NAN;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (isnan(x[i])) {
            nan = 1;
            continue;
        }
        if (isnan(l) || x[i] < l)
            l = x[i];
        if (isnan(h) || x[i] > h)
            h = x[i];
    }
    *lo = l;
    *hi = h;
    *unknown = nan;
}

/* A `Linear` form's part (framework.Linear.part) and offset: has = 0 when the part is None. */
typedef struct {
    int has;
    const double *values;
    double coef, fill, offset;
    int has_fill;
} fused_term;

/* `scorers.lower_is_better` of `values` with their extremes, then `Linear.part(weight)`. */
static void
fused_lower_is_better(fused_term *t, const double *values, double lo, double hi, int unknown, double weight)
{
    double fill = 0.5, scale, offset;
    int has_fill = unknown;
    if (hi > lo) {
        scale = 1.0 / (hi - lo);
        offset = hi * scale;
        if (scale <= 1e300 && isfinite(offset)) {
            t->has = 1;
            t->values = values;
            t->coef = weight * -scale;
            t->has_fill = has_fill;
            t->fill = weight * (fill - offset);
            t->offset = weight * offset;
            return;
        }
    }
    if (lo == lo) { /* Linear(values if unknown else None, 0.0, 1.0, fill) */
        t->has = unknown;
        t->values = values;
        t->coef = weight * 0.0;
        t->has_fill = has_fill;
        t->fill = weight * (fill - 1.0);
        t->offset = weight * 1.0;
        return;
    }
    t->has = 0; /* Linear(None, 0.0, NEUTRAL) */
    t->offset = weight * 0.5;
}

/* numpy's float64 add.reduce of n ≥ 1 contiguous values: numpy 2.4's pairwise_sum over all n (loops_utils: below
 * 8 values one running sum from -0.0; else 8 running sums, combined pairwise, then the rest one by one; n ≤ FUSED_MAX
 * so one block). Not the first value plus the pairwise sum of the rest: that differs by an ulp now and then
 * (tests/scheduling/test_fused.py holds the fused totals equal to the plugins', which use `ndarray.mean`). */
static double
fused_numpy_sum(const double *a, Py_ssize_t n)
{
    Py_ssize_t i;
    if (n < 8) {
        double r = -0.0;
        for (i = 0; i < n; i++)
            r += a[i];
        return r;
    }
    double r[8];
    for (i = 0; i < 8; i++)
        r[i] = a[i];
    for (i = 8; i < n - (n % 8); i += 8)
        for (int j = 0; j < 8; j++)
            r[j] += a[i + j];
    double s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; i++)
        s += a[i];
    return s;
}

/* The columns both calls read, by buffer: candidates (int64), waiting, picks since scrape (int64), kv usage,
 * scraped at, scrape failures (int64); then the prefill tokens booked (int64), read only by a pick where no kept
 * candidate's queue is known (its buffer taken then: not a cost of every pick). */
enum { F_CAND, F_WAIT, F_PICKS, F_KV, F_SCRAPED, F_FAIL, F_PREFILL, F_COLUMNS };

static int
fused_columns(PyObject *const *args, Py_buffer *views, int *held, Py_ssize_t *n, Py_ssize_t *slots)
{
    static const char *formats[F_PREFILL] = {"l", "d", "l", "d", "d", "l"};
    for (int b = 0; b < F_PREFILL; b++) {
        int got = typed(args[b], &views[b], formats[b], 8, 0);
        if (got != 0)
            return got;
        held[b] = 1;
    }
    *n = views[F_CAND].len / 8;
    *slots = views[F_WAIT].len / 8;
    for (int b = F_WAIT; b < F_PREFILL; b++)
        if (views[b].len / 8 != *slots) {
            PyErr_SetString(PyExc_ValueError, "the snapshot's columns differ in length");
            return -1;
        }
    const long *c = (const long *)views[F_CAND].buf;
    for (Py_ssize_t i = 0; i < *n; i++)
        if (c[i] < 0 || c[i] >= *slots) {
            PyErr_SetString(PyExc_IndexError, "a candidate outside the snapshot");
            return -1;
        }
    return 0;
}

/* The prefill column's buffer, taken only by a pick that reads it (no kept candidate's queue known): 0, 1 (another
 * type: NotImplemented) or -1 (an error set). Out of line: rare, and kept out of the pick's own code. */
static __attribute__((noinline, cold)) int
fused_prefill(PyObject *column, Py_buffer *view, int *held, Py_ssize_t slots)
{
    int got = typed(column, view, "l", 8, 0);
    if (got != 0)
        return got;
    *held = 1;
    if (view->len / 8 != slots) {
        PyErr_SetString(PyExc_ValueError, "the snapshot's columns differ in length");
        return -1;
    }
    return 0;
}

static void
fused_release(Py_buffer *views, int *held, int count)
{
    for (int b = 0; b < count; b++)
        if (held[b])
            PyBuffer_Release(&views[b]);
}

/* A detailed pick's shape tuple, (k, has, b0, b1, b2, b3): the last one built is handed out again while the values
 * repeat (pick after pick, as a rule), where building it cost ~1.5k instructions. A new reference. */
static unsigned long long last_shape[6];
static PyObject *last_shape_tuple;

static PyObject *
detail_shape(const unsigned long long *shape)
{
    if (last_shape_tuple != NULL && memcmp(shape, last_shape, sizeof last_shape) == 0)
        return Py_NewRef(last_shape_tuple);
    PyObject *out = PyTuple_New(6);
    if (out == NULL)
        return NULL;
    for (int i = 0; i < 6; i++) {
        PyObject *x = i < 2 ? PyLong_FromLongLong((long long)shape[i]) : PyLong_FromUnsignedLongLong(shape[i]);
        if (x == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, x);
    }
    memcpy(last_shape, shape, sizeof last_shape);
    Py_XSETREF(last_shape_tuple, Py_NewRef(out));
    return out;
}

/* fused_pick(candidates, (waiting, picks, kv, scraped_at, failures, prefill), fresh_from, state,
 *            (max_failures, queue_limit, kv_limit, lookup, w_queue, w_kv, w_prefix, w_inflight, tie, draw),
 *            totals, detail) -> int | (int, int, int) | NotImplemented
 *
 * The default profile's pick (fused.py): `SaturationFilter.filter` over `CycleState.usable` (fresh_from =
 * now − staleness) and the effective queue (waiting + picks, NaN where the data is not usable); then the prefix
 * scorer's lookup, `lookup(state, first)` with the first kept slot (the slot its hasher reads the block size of),
 * answering (hashes, matched per slot, reach); then over the kept candidates queue-scorer,
 * kv-cache-utilization-scorer, prefix-cache-scorer and inflight-load-scorer (with nothing known, the prefill
 * booked), each `Linear` weighted, their total
 * (`weighted_total`) and the max-score picker's choice (`max_tie`, `draw` called only on a tie): the slot is
 * returned. `totals`: None, or n float64 that get the kept candidates' totals first, NaN after them. `detail`: None,
 * or (kept, rows, constants) for a detailed pick (the runner's `SCORED` and `TERMS`): kept (n int64) gets the k kept
 * candidates first, rows (4 × n float64) each weighted term that has per-candidate values (`weighted_total_rows`'
 * rows) as a k-long row, one after another from the start (m rows: m × k values), constants (4 float64) each
 * scorer's constant part (weight × its form's offset); the answer is then (slot, (k, has, b0, b1, b2, b3)), bit t
 * of `has` set when scorer t has a row, b0..b3 the constants' bits (the detail's shape: of one shape the detail
 * differs only in the buffers' values, so the caller keeps its views of them by it; bits, not floats, so that 0.0
 * and -0.0 differ and NaN matches itself). NotImplemented (nothing called, nothing written) for a pool of more than
 * FUSED_MAX candidates or a column of another type. */
static PyObject *
fused_pick(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 7 || !PyTuple_Check(args[1]) || PyTuple_GET_SIZE(args[1]) != F_COLUMNS - 1 ||
        !PyTuple_Check(args[4]) || PyTuple_GET_SIZE(args[4]) != 10) {
        PyErr_SetString(PyExc_TypeError, "fused_pick takes candidates, (5 columns), fresh_from, state, (10 fixed), "
                                         "totals and detail");
        return NULL;
    }
    PyObject *columns[F_COLUMNS] = {args[0]};
    for (int b = 1; b < F_COLUMNS; b++)
        columns[b] = PyTuple_GET_ITEM(args[1], b - 1);
    PyObject *const *fixed = &PyTuple_GET_ITEM(args[4], 0);
    PyObject *state = args[3], *lookup = fixed[3], *draw = fixed[9], *totals_arg = args[5];
    double fresh_from = PyFloat_AsDouble(args[2]);
    long long max_failures = PyLong_AsLongLong(fixed[0]);
    double ql = PyFloat_AsDouble(fixed[1]), kl = PyFloat_AsDouble(fixed[2]);
    double wq = PyFloat_AsDouble(fixed[4]), wkv = PyFloat_AsDouble(fixed[5]);
    double wp = PyFloat_AsDouble(fixed[6]), wi = PyFloat_AsDouble(fixed[7]);
    double tie = PyFloat_AsDouble(fixed[8]);
    if (PyErr_Occurred())
        return NULL;
    /* the columns, the prefix match (F_COLUMNS), totals (+1), and the detail's kept, rows, constants (+2..+4) */
    enum { F_MATCH = F_COLUMNS, F_TOTALS, F_KEPT, F_ROWS, F_CONSTANTS, F_VIEWS };
    Py_buffer views[F_VIEWS];
    int held[F_VIEWS] = {0};
    Py_ssize_t n, slots;
    PyObject *result = NULL, *found = NULL;
    PyObject *detail = args[6];
    if (detail != Py_None && (!PyTuple_Check(detail) || PyTuple_GET_SIZE(detail) != 3)) {
        PyErr_SetString(PyExc_TypeError, "detail is None or (kept, rows, constants)");
        return NULL;
    }
    int got = fused_columns(columns, views, held, &n, &slots);
    if (got == 0 && totals_arg != Py_None) {
        got = doubles(totals_arg, &views[F_TOTALS], 1);
        held[F_TOTALS] = got == 0;
    }
    if (got == 0 && detail != Py_None) {
        got = typed(PyTuple_GET_ITEM(detail, 0), &views[F_KEPT], "l", 8, 1);
        held[F_KEPT] = got == 0;
        if (got == 0) {
            got = doubles(PyTuple_GET_ITEM(detail, 1), &views[F_ROWS], 1);
            held[F_ROWS] = got == 0;
        }
        if (got == 0) {
            got = doubles(PyTuple_GET_ITEM(detail, 2), &views[F_CONSTANTS], 1);
            held[F_CONSTANTS] = got == 0;
        }
    }
    if (got != 0) {
        result = got < 0 ? NULL : Py_NewRef(Py_NotImplemented);
        goto done;
    }
    if (n < 1 || n > FUSED_MAX || (held[F_TOTALS] && views[F_TOTALS].len != n * 8) ||
        (held[F_KEPT] &&
         (views[F_KEPT].len != n * 8 || views[F_ROWS].len != 4 * n * 8 || views[F_CONSTANTS].len != 4 * 8))) {
        result = Py_NewRef(Py_NotImplemented);
        goto done;
    }
    const long *cand = (const long *)views[F_CAND].buf, *picks = (const long *)views[F_PICKS].buf;
    const long *fail = (const long *)views[F_FAIL].buf, *prefill = NULL;
    const double *w = (const double *)views[F_WAIT].buf, *kvc = (const double *)views[F_KV].buf;
    const double *at = (const double *)views[F_SCRAPED].buf;
    /* the filter: the kept candidates, or all of them when none or all would be kept */
    long c[FUSED_MAX];
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        long s = cand[i];
        int fresh = at[s] >= fresh_from && (long long)fail[s] < max_failures;
        if (fresh && !(w[s] + (double)picks[s] >= ql || kvc[s] >= kl))
            c[k++] = s;
    }
    if (k == 0 || k == n) {
        k = n;
        memcpy(c, cand, (size_t)n * sizeof(long));
    }
    n = k;
    /* no kept candidate's effective queue known: inflight-load-scorer reads the prefill booked */
    int any_known = 0;
    for (Py_ssize_t i = 0; i < n && !any_known; i++) {
        long s = c[i];
        any_known = at[s] >= fresh_from && (long long)fail[s] < max_failures && !isnan(w[s] + (double)picks[s]);
    }
    if (!any_known) {
        got = fused_prefill(columns[F_PREFILL], &views[F_PREFILL], &held[F_PREFILL], slots);
        if (got != 0) {
            result = got < 0 ? NULL : Py_NewRef(Py_NotImplemented);
            goto done;
        }
        prefill = (const long *)views[F_PREFILL].buf;
    }
    /* the prefix lookup */
    PyObject *call[2] = {state, PyLong_FromLong(c[0])};
    if (call[1] == NULL)
        goto done;
    found = PyObject_Vectorcall(lookup, call, 2, NULL);
    Py_DECREF(call[1]);
    if (found == NULL)
        goto done;
    if (!PyTuple_Check(found) || PyTuple_GET_SIZE(found) != 3 || !PyList_Check(PyTuple_GET_ITEM(found, 0))) {
        PyErr_SetString(PyExc_TypeError, "lookup answers (hashes, matched, reach)");
        goto done;
    }
    Py_ssize_t blocks = PyList_GET_SIZE(PyTuple_GET_ITEM(found, 0));
    Py_ssize_t reach = PyLong_AsSsize_t(PyTuple_GET_ITEM(found, 2));
    if (reach == -1 && PyErr_Occurred())
        goto done;
    const double *matched_col = NULL;
    if (reach) {
        got = doubles(PyTuple_GET_ITEM(found, 1), &views[F_MATCH], 0);
        if (got != 0) {
            result = got < 0 ? NULL : Py_NewRef(Py_NotImplemented);
            goto done;
        }
        held[F_MATCH] = 1;
        if (views[F_MATCH].len / 8 < slots || blocks == 0) {
            result = Py_NewRef(Py_NotImplemented);
            goto done;
        }
        matched_col = (const double *)views[F_MATCH].buf;
    }
    double total[FUSED_MAX];
    double queue[FUSED_MAX], kv[FUSED_MAX], load[FUSED_MAX], matched[FUSED_MAX], known[FUSED_MAX];
    for (Py_ssize_t i = 0; i < n; i++) {
        long s = c[i];
        int fresh = at[s] >= fresh_from && (long long)fail[s] < max_failures;
        queue[i] = fresh ? w[s] : NAN;
        kv[i] = fresh ? kvc[s] : NAN;
        load[i] = fresh ? w[s] + (double)picks[s] : NAN;
        matched[i] = matched_col != NULL ? matched_col[s] : 0.0;
    }
    fused_term terms[4];
    double lo, hi;
    int unknown;
    /* queue-scorer: lower_is_better of waiting */
    fused_extremes(queue, n, &lo, &hi, &unknown);
    fused_lower_is_better(&terms[0], queue, lo, hi, unknown, wq);
    /* kv-cache-utilization-scorer: 1 − kv clipped to [0, 1], unknown 0.5 */
    fused_extremes(kv, n, &lo, &hi, &unknown);
    if (lo < 0.0 || hi > 1.0)
        for (Py_ssize_t i = 0; i < n; i++)
            if (!isnan(kv[i]))
                kv[i] = kv[i] < 0.0 ? 0.0 : kv[i] > 1.0 ? 1.0 : kv[i];
    terms[1] = (fused_term){1, kv, wkv * -1.0, wkv * (0.5 - 1.0), wkv * 1.0, unknown};
    /* prefix-cache-scorer: matched / prompt blocks, 0 when nobody holds the first block */
    if (matched_col != NULL)
        terms[2] = (fused_term){1, matched, wp * (1.0 / (double)blocks), 0.0, wp * 0.0, 0};
    else
        terms[2] = (fused_term){0, NULL, 0.0, 0.0, wp * 0.0, 0};
    /* inflight-load-scorer: the effective queue, unknown → the known candidates' mean + own picks; nothing
     * known → our prefill booked there */
    fused_extremes(load, n, &lo, &hi, &unknown);
    if (unknown) {
        Py_ssize_t m = 0;
        for (Py_ssize_t i = 0; i < n; i++)
            if (!isnan(load[i]))
                known[m++] = load[i];
        if (m == 0) /* !any_known: the same test */
            for (Py_ssize_t i = 0; i < n; i++)
                load[i] = (double)prefill[c[i]];
        else {
            double typical = fused_numpy_sum(known, m) / (double)m;
            for (Py_ssize_t i = 0; i < n; i++)
                if (isnan(load[i]))
                    load[i] = typical + (double)picks[c[i]];
        }
        fused_extremes(load, n, &lo, &hi, &unknown);
    }
    fused_lower_is_better(&terms[3], load, lo, hi, unknown, wi);
    double offset = 0.0;
    for (int t = 0; t < 4; t++)
        offset += terms[t].offset;
    /* a detailed pick's rows: term t's row at its rank among the terms that have one (row[t] = -1: none) */
    double *rows = held[F_ROWS] ? (double *)views[F_ROWS].buf : NULL;
    Py_ssize_t row[4];
    long has = 0;
    for (int t = 0, m = 0; t < 4; t++) {
        row[t] = terms[t].has ? (Py_ssize_t)(m++) * n : -1;
        has |= terms[t].has ? 1L << t : 0;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        double sum = 0.0;
        int first = 1;
        for (int t = 0; t < 4; t++) {
            if (!terms[t].has)
                continue;
            double x = terms[t].values[i] * terms[t].coef;
            if (terms[t].has_fill) {
                if (isnan(x))
                    x = terms[t].fill;
                else if (isinf(x))
                    x = x > 0 ? DBL_MAX : -DBL_MAX;
            }
            if (rows != NULL)
                rows[row[t] + i] = x;
            sum = first ? x : sum + x;
            first = 0;
        }
        if (first) /* no term: the same score everywhere (the runner's uniform scores, no fmax) */
            total[i] = offset;
        else {
            if (offset != 0.0)
                sum += offset;
            total[i] = sum >= 0.0 ? sum : 0.0;
        }
    }
    if (held[F_TOTALS]) {
        double *out = (double *)views[F_TOTALS].buf;
        Py_ssize_t all = views[F_TOTALS].len / 8;
        for (Py_ssize_t i = 0; i < all; i++)
            out[i] = i < n ? total[i] : NAN;
    }
    if (held[F_KEPT]) {
        memcpy(views[F_KEPT].buf, c, (size_t)n * sizeof(long));
        double *constants = (double *)views[F_CONSTANTS].buf;
        for (int t = 0; t < 4; t++)
            constants[t] = terms[t].offset;
    }
    Py_ssize_t choice = tie_choice(total, n, tie, draw);
    if (choice < 0)
        goto done;
    if (held[F_KEPT]) {
        unsigned long long shape[6] = {(unsigned long long)n, (unsigned long long)has};
        for (int t = 0; t < 4; t++)
            memcpy(&shape[2 + t], &terms[t].offset, 8);
        PyObject *shaped = detail_shape(shape);
        PyObject *slot = shaped != NULL ? PyLong_FromLong(c[choice]) : NULL;
        result = slot != NULL ? PyTuple_New(2) : NULL;
        if (result == NULL) {
            Py_XDECREF(shaped);
            Py_XDECREF(slot);
            goto done;
        }
        PyTuple_SET_ITEM(result, 0, slot);
        PyTuple_SET_ITEM(result, 1, shaped);
    } else
        result = PyLong_FromLong(c[choice]);
done:
    Py_XDECREF(found);
    fused_release(views, held, F_VIEWS);
    return result;
}

static PyMethodDef methods[] = {
    {"fused_pick", (PyCFunction)(void (*)(void))fused_pick, METH_FASTCALL,
     "The default profile's filter, scorers, total and max-score pick (fused.py)."},
    {"kept_under", (PyCFunction)(void (*)(void))kept_under, METH_FASTCALL,
     "The saturation filter's elementwise pass into `out` (saturation.py's kept_under_numpy)."},
    {"weighted_total", (PyCFunction)(void (*)(void))weighted_total, METH_FASTCALL,
     "The weighted total of the scorers' terms into `out` (totals.py's weighted_total_numpy)."},
    {"weighted_total_rows", (PyCFunction)(void (*)(void))weighted_total_rows, METH_FASTCALL,
     "weighted_total, each term also written into its row of `rows` (totals.py's weighted_total_rows_numpy)."},
    {"small_extremes", small_extremes, METH_O,
     "(min, max, False) of a small array of known values (framework.py's small_extremes)."},
    {"prefix_match", (PyCFunction)(void (*)(void))prefix_match, METH_FASTCALL,
     "The prefix index's match into `out`, its reach returned (prefix.py's PrefixIndex.match_python)."},
    {"holds_all", (PyCFunction)(void (*)(void))holds_all, METH_FASTCALL,
     "Whether the set holds every hash of the list (prefix.py's young.issuperset(hashes) in holds_young)."},
    {"max_tie", (PyCFunction)(void (*)(void))max_tie, METH_FASTCALL,
     "The index of the highest score, ties drawn (totals.py's max_tie_numpy)."},
    {NULL, NULL, 0, NULL},
};

EPP_OPTIONAL_MODULE(PyInit__native, "epp.scheduling._native",
                    "The runner's weighted total and tie search (see totals.py).", methods, NULL)
