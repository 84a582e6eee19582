/* The module definition every optional C extension of epp shares (epp/kvevents/_native.c, epp/app/_pick_log.c,
 * epp/scheduling/_native.c and _receipt.c, epp/extproc/_headers.c and _metadata.c).
 *
 * Each is a fast path beside a Python definition that stays the reference: `ENABLED` tells the Python side whether
 * to call it. It is 0 when EPP_NATIVE=0 was in the environment at import, so the Python code can be run (and
 * measured, and checked against the compiled code) in a process where the extension is built. One place for it, so
 * the switch means the same in every extension.
 *
 *     EPP_OPTIONAL_MODULE(PyInit__native, "epp.scheduling._native", "doc", methods, NULL)
 *
 * `setup` is NULL or a `static int setup(PyObject *module)` run first at import (-1 with an exception set fails
 * the import). */
#ifndef EPP_OPTIONAL_MODULE_H
#define EPP_OPTIONAL_MODULE_H

#include <Python.h>
#include <stdlib.h>
#include <string.h>

static int
epp_add_enabled(PyObject *module)
{
    const char *env = getenv("EPP_NATIVE");
    return PyModule_AddIntConstant(module, "ENABLED", !(env != NULL && strcmp(env, "0") == 0));
}

#define EPP_OPTIONAL_MODULE(init_name, dotted_name, doc, method_table, setup)                                      \
    static int epp_exec_module(PyObject *module)                                                                   \
    {                                                                                                              \
        int (*first)(PyObject *) = (setup);                                                                        \
        if (first != NULL && first(module) < 0)                                                                    \
            return -1;                                                                                             \
        return epp_add_enabled(module);                                                                            \
    }                                                                                                              \
    static PyModuleDef_Slot epp_slots[] = {                                                                        \
        {Py_mod_exec, (void *)epp_exec_module},                                                                    \
        {0, NULL},                                                                                                 \
    };                                                                                                             \
    static struct PyModuleDef epp_module_def = {                                                                   \
        PyModuleDef_HEAD_INIT, dotted_name, doc, 0, method_table, epp_slots, NULL, NULL, NULL,                     \
    };                                                                                                             \
    PyMODINIT_FUNC init_name(void) { return PyModuleDef_Init(&epp_module_def); }

#endif
