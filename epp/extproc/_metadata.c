/* The `envoy.lb` dynamic metadata of an answer that carries scores or a route receipt, as wire bytes in one call:
 * a google.protobuf.Struct of one field, `envoy.lb`, whose struct holds the destination, the scores struct (address →
 * number) and the receipt (a string). Built at install when a compiler is there (setup.py: optional); the answer
 * merges them in (`MergeFromString` on its `dynamic_metadata`: a map entry parsed replaces one of the same key, and
 * these bytes carry the whole `envoy.lb` struct, destination too), where writing the scores struct field by field
 * costs a upb map write per endpoint.
 *
 * Not a definition of its own: `decision_metadata` (epp/extproc/messages.py) is, and
 * tests/extproc/test_metadata_native.py holds the two equal (the same message) on random inputs. Anything else than
 * str addresses and float scores answers NotImplemented and the Python code runs. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../optional_module.h"
#include "../struct_wire.h"
#include <stdint.h>
#include <string.h>

#define TAG_DYNAMIC_METADATA 0x42 /* ProcessingResponse.dynamic_metadata (8) */

/* lb_metadata(head, namespace, destination_key, destination, scores_key, scores, receipt_key, receipt[, entries])
 *     -> bytes | NotImplemented
 *
 * scores: a tuple of (address, score) pairs (empty: no scores struct); receipt: a str or None (or "": none);
 * destination "": none written; entries: bytes of further entries of the `envoy.lb` struct, already encoded (a
 * route receipt's, written by its own call: epp/scheduling/_receipt.c's account_pick), written after the others as
 * they are (None or b"": none). head None: the Struct's bytes (for `dynamic_metadata.MergeFromString`); head bytes
 * (a serialized ProcessingResponse): head, then the Struct as its `dynamic_metadata` field, a whole answer to parse
 * (a second occurrence of a message field merges into the first; its `envoy.lb` entry replaces head's). */
static PyObject *
lb_metadata(PyObject *self, PyObject *const *all, Py_ssize_t nall)
{
    (void)self;
    if (nall != 8 && nall != 9) {
        PyErr_SetString(PyExc_TypeError, "lb_metadata takes head, namespace, destination key, destination, scores "
                                         "key, scores, receipt key, receipt[, entries]");
        return NULL;
    }
    PyObject *entries = nall == 9 ? all[8] : Py_None;
    if (entries != Py_None && !PyBytes_CheckExact(entries))
        return Py_NewRef(Py_NotImplemented);
    Py_ssize_t entries_len = entries == Py_None ? 0 : PyBytes_GET_SIZE(entries);
    PyObject *head = all[0];
    if (head != Py_None && !PyBytes_CheckExact(head))
        return Py_NewRef(Py_NotImplemented);
    PyObject *const *args = all + 1;
    const char *text[7];
    Py_ssize_t size[7];
    for (int i = 0; i < 7; i++) {
        if (i == 4 || (i == 6 && args[6] == Py_None)) {
            text[i] = NULL;
            size[i] = 0;
            continue;
        }
        if (!PyUnicode_CheckExact(args[i]))
            return Py_NewRef(Py_NotImplemented);
        text[i] = PyUnicode_AsUTF8AndSize(args[i], &size[i]);
        if (text[i] == NULL) {
            PyErr_Clear();
            return Py_NewRef(Py_NotImplemented);
        }
    }
    PyObject *scores = args[4];
    if (!PyTuple_CheckExact(scores))
        return Py_NewRef(Py_NotImplemented);
    Py_ssize_t n = PyTuple_GET_SIZE(scores);
    /* the scores struct's size */
    Py_ssize_t scores_struct = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PyTuple_GET_ITEM(scores, i);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyUnicode_CheckExact(PyTuple_GET_ITEM(pair, 0)) ||
            !PyFloat_CheckExact(PyTuple_GET_ITEM(pair, 1)))
            return Py_NewRef(Py_NotImplemented);
        Py_ssize_t alen;
        if (PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), &alen) == NULL) {
            PyErr_Clear();
            return Py_NewRef(Py_NotImplemented);
        }
        scores_struct += number_entry_size(alen);
    }
    Py_ssize_t lb_struct = 0;
    if (size[2])
        lb_struct += delimited(entry_body(size[1], delimited(size[2])));
    if (n)
        lb_struct += delimited(entry_body(size[3], delimited(scores_struct)));
    if (size[6])
        lb_struct += delimited(entry_body(size[5], delimited(size[6])));
    lb_struct += entries_len;
    if (lb_struct == 0) /* nothing written: the Python code leaves the namespace's Value empty, not an empty struct */
        return Py_NewRef(Py_NotImplemented);
    Py_ssize_t lb_value = delimited(lb_struct);
    Py_ssize_t body = delimited(entry_body(size[0], lb_value));
    Py_ssize_t head_len = head == Py_None ? 0 : PyBytes_GET_SIZE(head);
    Py_ssize_t total = head == Py_None ? body : head_len + delimited(body);
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        return NULL;
    char *w = PyBytes_AS_STRING(out);
    if (head != Py_None) {
        memcpy(w, PyBytes_AS_STRING(head), head_len);
        w = put_header(w + head_len, TAG_DYNAMIC_METADATA, body);
    }
    /* Struct{fields: {namespace: Value{struct_value: Struct{...}}}} */
    w = put_struct_entry_head(w, text[0], size[0], lb_struct);
    if (size[2])
        w = put_string_entry(w, text[1], size[1], text[2], size[2]);
    if (n) {
        w = put_struct_entry_head(w, text[3], size[3], scores_struct);
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *pair = PyTuple_GET_ITEM(scores, i);
            Py_ssize_t alen;
            const char *address = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), &alen);
            double score = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(pair, 1));
            w = put_number_entry(w, address, alen, score);
        }
    }
    if (size[6])
        w = put_string_entry(w, text[5], size[5], text[6], size[6]);
    if (entries_len) {
        memcpy(w, PyBytes_AS_STRING(entries), entries_len);
        w += entries_len;
    }
    if (w != PyBytes_AS_STRING(out) + total) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_SystemError, "lb_metadata: sizes and bytes written differ");
        return NULL;
    }
    return out;
}

static PyMethodDef methods[] = {
    {"lb_metadata", (PyCFunction)(void (*)(void))lb_metadata, METH_FASTCALL,
     "The envoy.lb dynamic metadata as Struct wire bytes (messages.py's decision_metadata)."},
    {NULL, NULL, 0, NULL},
};

EPP_OPTIONAL_MODULE(PyInit__metadata, "epp.extproc._metadata",
                    "The envoy.lb metadata as wire bytes (see messages.py).", methods, NULL)
