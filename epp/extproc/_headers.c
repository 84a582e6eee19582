/* Envoy's request header map as a dict, compiled: read from the map's serialized bytes (one upb encode) instead of
 * through upb's Python wrappers, which cost ~4 attribute reads and a decode per header (~40k instructions for the
 * ~10 headers of a request). Built at install when a compiler is there (setup.py: optional).
 *
 * Not a definition of its own: `epp.extproc.messages.headers_to_dict_upb` is, and tests/extproc/test_headers.py
 * holds the two equal on random maps. The wire format read (envoy.config.core.v3): HeaderMap { repeated HeaderValue
 * headers = 1; } and HeaderValue { string key = 1; string value = 2; bytes raw_value = 3; }, each field's last
 * occurrence winning as protobuf's parser does. Per header, in order: dict[key] = raw_value decoded as UTF-8, or
 * `value` when that is empty. Anything this does not read exactly so — a value that is not UTF-8 (the definition
 * then replaces bad bytes), a field of another wire type, a truncated message — answers None, and the definition
 * runs. EPP_NATIVE=0 in the environment at import sets ENABLED to 0. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../optional_module.h"
#include <stdint.h>
#include <string.h>

/* A varint at *p (below end) into *out; 0 when truncated or longer than 10 bytes. */
static int
varint(const unsigned char **p, const unsigned char *end, uint64_t *out)
{
    uint64_t value = 0;
    for (int shift = 0; shift < 70 && *p < end; shift += 7) {
        unsigned char byte = *(*p)++;
        value |= (uint64_t)(byte & 0x7f) << shift;
        if (!(byte & 0x80)) {
            *out = value;
            return 1;
        }
    }
    return 0;
}

/* A length-delimited field's bytes at *p: its start and length; 0 when truncated. */
static int
delimited(const unsigned char **p, const unsigned char *end, const unsigned char **start, Py_ssize_t *len)
{
    uint64_t n;
    if (!varint(p, end, &n) || n > (uint64_t)(end - *p))
        return 0;
    *start = *p;
    *len = (Py_ssize_t)n;
    *p += n;
    return 1;
}

/* One HeaderValue into dict; 1 done, 0 not read here (None), -1 a Python error. */
static int
header_value(PyObject *dict, const unsigned char *p, const unsigned char *end)
{
    const unsigned char *key = (const unsigned char *)"", *value = key, *raw = key;
    Py_ssize_t key_len = 0, value_len = 0, raw_len = 0;
    while (p < end) {
        uint64_t tag;
        if (!varint(&p, end, &tag) || (tag & 7) != 2)
            return 0;
        const unsigned char *start;
        Py_ssize_t len;
        if (!delimited(&p, end, &start, &len))
            return 0;
        switch (tag >> 3) {
        case 1:
            key = start, key_len = len;
            break;
        case 2:
            value = start, value_len = len;
            break;
        case 3:
            raw = start, raw_len = len;
            break;
        default:
            return 0;
        }
    }
    PyObject *k = PyUnicode_DecodeUTF8((const char *)key, key_len, NULL);
    if (k == NULL) {
        PyErr_Clear();
        return 0;
    }
    PyObject *v = raw_len ? PyUnicode_DecodeUTF8((const char *)raw, raw_len, NULL)
                          : PyUnicode_DecodeUTF8((const char *)value, value_len, NULL);
    if (v == NULL) {
        Py_DECREF(k);
        PyErr_Clear();
        return 0;
    }
    int rc = PyDict_SetItem(dict, k, v);
    Py_DECREF(k);
    Py_DECREF(v);
    return rc < 0 ? -1 : 1;
}

/* header_dict(data: bytes) -> dict | None: a serialized HeaderMap as `headers_to_dict_upb` reads it. */
static PyObject *
header_dict(PyObject *self, PyObject *arg)
{
    (void)self;
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "header_dict takes bytes");
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(arg);
    const unsigned char *end = p + PyBytes_GET_SIZE(arg);
    PyObject *dict = PyDict_New();
    if (dict == NULL)
        return NULL;
    while (p < end) {
        uint64_t tag;
        const unsigned char *start;
        Py_ssize_t len;
        if (!varint(&p, end, &tag) || tag != ((1 << 3) | 2) || !delimited(&p, end, &start, &len))
            goto not_here;
        int rc = header_value(dict, start, start + len);
        if (rc < 0) {
            Py_DECREF(dict);
            return NULL;
        }
        if (rc == 0)
            goto not_here;
    }
    return dict;
not_here:
    Py_DECREF(dict);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"header_dict", header_dict, METH_O,
     "A serialized HeaderMap as a dict (messages.py's headers_to_dict_upb); None where that one must run."},
    {NULL, NULL, 0, NULL},
};

EPP_OPTIONAL_MODULE(PyInit__headers, "epp.extproc._headers", NULL, methods, NULL)
