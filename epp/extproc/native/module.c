/* epp.extproc.native._h2: the Python face of the h2 connection (h2.c, h2_recv.c). One `Connection` per accepted
 * socket; `receive(bytes)` returns the events of those bytes as a list of (kind, stream id, value) tuples — value
 * is the message's bytes (MESSAGE), (:path, the other fields as "name\0value\0"...) for OPEN, an error code
 * (RESET, GOAWAY, CLOSE), None for END —; a GOAWAY is the peer's (stream id: its last) or, with stream id 0, the
 * final GOAWAY of our graceful `drain()`, sent once the peer acknowledged its PING;
 * `send`/`finish`/`reset` queue frames, `output()` takes what must be written. No I/O, no threads: the asyncio
 * loop owns the socket and calls in. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "h2.h"

typedef struct {
    PyObject_HEAD h2_conn c;
    PyObject *events; /* the list being filled during receive() */
} Conn;

static int on_event(void *ctx, int kind, uint32_t sid, const uint8_t *data, size_t len, uint32_t code) {
    Conn *self = ctx;
    PyObject *value;
    if (kind == EV_OPEN) {
        value = Py_BuildValue("(y#y#)", data, (Py_ssize_t)len, self->c.meta, (Py_ssize_t)self->c.meta_len);
    } else if (kind == EV_MESSAGE) {
        value = PyBytes_FromStringAndSize((const char *)data, (Py_ssize_t)len);
    } else if (kind == EV_END) {
        value = Py_NewRef(Py_None);
    } else {
        value = PyLong_FromUnsignedLong(code);
    }
    if (!value) return -1;
    PyObject *t = Py_BuildValue("(iIN)", kind, sid, value);
    if (!t) return -1;
    int rc = PyList_Append(self->events, t);
    Py_DECREF(t);
    return rc;
}

static PyObject *Conn_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *names[] = {"max_message", NULL};
    unsigned int max_message = 4u << 20;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|I", names, &max_message)) return NULL;
    Conn *self = (Conn *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    if (h2_init(&self->c, max_message) < 0) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->c.cb = on_event, self->c.ctx = self;
    return (PyObject *)self;
}

static void Conn_dealloc(Conn *self) {
    h2_free(&self->c);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Conn_receive(Conn *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *events = PyList_New(0);
    if (!events) {
        PyBuffer_Release(&view);
        return NULL;
    }
    self->events = events;
    self->c.cb_failed = 0;
    int rc = h2_receive(&self->c, view.buf, (size_t)view.len);
    self->events = NULL;
    PyBuffer_Release(&view);
    if (rc < 0) {
        Py_DECREF(events);
        if (!PyErr_Occurred()) PyErr_NoMemory();
        return NULL;
    }
    return events;
}

static PyObject *Conn_send(Conn *self, PyObject *args) {
    unsigned int sid;
    Py_buffer msg;
    if (!PyArg_ParseTuple(args, "Iy*", &sid, &msg)) return NULL;
    int rc = h2_send_message(&self->c, sid, msg.buf, (size_t)msg.len);
    PyBuffer_Release(&msg);
    if (rc < 0) return PyErr_NoMemory();
    return PyBool_FromLong(rc == 0);
}

static PyObject *Conn_finish(Conn *self, PyObject *args) {
    unsigned int sid, status;
    const char *message = "";
    Py_ssize_t mlen = 0;
    if (!PyArg_ParseTuple(args, "II|s#", &sid, &status, &message, &mlen)) return NULL;
    int rc = h2_finish(&self->c, sid, status, message, (size_t)mlen);
    if (rc < 0) return PyErr_NoMemory();
    return PyBool_FromLong(rc == 0);
}

static PyObject *Conn_reset(Conn *self, PyObject *args) {
    unsigned int sid, code = 8; /* CANCEL */
    if (!PyArg_ParseTuple(args, "I|I", &sid, &code)) return NULL;
    return PyBool_FromLong(h2_reset(&self->c, sid, code) == 0);
}

static PyObject *Conn_goaway(Conn *self, PyObject *args) {
    unsigned int code = 0;
    if (!PyArg_ParseTuple(args, "|I", &code)) return NULL;
    h2_goaway(&self->c, code);
    Py_RETURN_NONE;
}

static PyObject *Conn_drain(Conn *self, PyObject *Py_UNUSED(ignored)) {
    h2_drain(&self->c);
    Py_RETURN_NONE;
}

static PyObject *Conn_output(Conn *self, PyObject *Py_UNUSED(ignored)) {
    h2_buf *out = &self->c.out;
    PyObject *b = PyBytes_FromStringAndSize((const char *)out->p, (Py_ssize_t)out->len);
    if (b) buf_consume(out, out->len);
    return b;
}

static PyObject *Conn_get_open(Conn *self, void *Py_UNUSED(closure)) { return PyLong_FromUnsignedLong(self->c.nstreams); }

static PyObject *Conn_get_closed(Conn *self, void *Py_UNUSED(closure)) { return PyBool_FromLong(self->c.closed); }

static PyMethodDef Conn_methods[] = {
    {"receive", (PyCFunction)Conn_receive, METH_O, "Feed received bytes; the list of events they make."},
    {"send", (PyCFunction)Conn_send, METH_VARARGS, "send(stream_id, message): False when the stream is gone."},
    {"finish", (PyCFunction)Conn_finish, METH_VARARGS, "finish(stream_id, status, message=''): the trailers."},
    {"reset", (PyCFunction)Conn_reset, METH_VARARGS, "reset(stream_id, code=CANCEL): RST_STREAM."},
    {"goaway", (PyCFunction)Conn_goaway, METH_VARARGS, "goaway(code=NO_ERROR): no new streams."},
    {"drain", (PyCFunction)Conn_drain, METH_NOARGS,
     "The graceful drain: GOAWAY(2^31-1) and a PING; the final GOAWAY on its ACK (a GOAWAY event, stream 0)."},
    {"output", (PyCFunction)Conn_output, METH_NOARGS, "The bytes to write, taken."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Conn_getset[] = {
    {"open_streams", (getter)Conn_get_open, NULL, "streams not yet ended on both sides", NULL},
    {"closed", (getter)Conn_get_closed, NULL, "a connection error ended it (GOAWAY queued)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ConnType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "epp.extproc.native._h2.Connection",
    .tp_basicsize = sizeof(Conn),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The server side of one HTTP/2 connection carrying gRPC, without I/O.",
    .tp_new = Conn_new,
    .tp_dealloc = (destructor)Conn_dealloc,
    .tp_methods = Conn_methods,
    .tp_getset = Conn_getset,
};

static PyObject *huffman_decode(PyObject *Py_UNUSED(m), PyObject *arg) {
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_SIMPLE) < 0) return NULL;
    uint8_t *out = PyMem_Malloc((size_t)v.len * 8 / 5 + 1);
    long n = out ? hp_huffman_decode(v.buf, (size_t)v.len, out) : -1;
    PyObject *r = n >= 0 ? PyBytes_FromStringAndSize((char *)out, n) : NULL;
    if (n < 0 && out) PyErr_SetString(PyExc_ValueError, "malformed Huffman string");
    PyMem_Free(out);
    PyBuffer_Release(&v);
    return out ? r : PyErr_NoMemory();
}

static int collect(void *ctx, const uint8_t *name, size_t nlen, const uint8_t *value, size_t vlen) {
    PyObject *t = Py_BuildValue("(y#y#)", name, (Py_ssize_t)nlen, value, (Py_ssize_t)vlen);
    if (!t) return -1;
    int rc = PyList_Append(ctx, t);
    Py_DECREF(t);
    return rc;
}

/* For tests: decode a sequence of header blocks through one decoder (its dynamic table carried across). */
static PyObject *decode_blocks(PyObject *Py_UNUSED(m), PyObject *blocks) {
    PyObject *seq = PySequence_Fast(blocks, "a sequence of header blocks");
    if (!seq) return NULL;
    hp_decoder d;
    hp_init(&d, 4096);
    PyObject *result = PyList_New(0);
    for (Py_ssize_t i = 0; result && i < PySequence_Fast_GET_SIZE(seq); i++) {
        char *p;
        Py_ssize_t n;
        PyObject *fields = PyList_New(0);
        if (!fields || PyBytes_AsStringAndSize(PySequence_Fast_GET_ITEM(seq, i), &p, &n) < 0 ||
            hp_decode(&d, (uint8_t *)p, (size_t)n, collect, fields) < 0 || PyList_Append(result, fields) < 0) {
            if (fields && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "compression error");
            Py_XDECREF(fields);
            Py_CLEAR(result);
            break;
        }
        Py_DECREF(fields);
    }
    hp_free(&d);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef methods[] = {
    {"huffman_decode", huffman_decode, METH_O, "HPACK's Huffman code, decoded (ValueError when malformed)."},
    {"decode_blocks", decode_blocks, METH_O, "Header blocks through one HPACK decoder: a list of field lists."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_h2", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__h2(void) {
    if (PyType_Ready(&ConnType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Connection", (PyObject *)&ConnType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
