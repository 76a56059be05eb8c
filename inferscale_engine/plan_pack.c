/* An injection plan's packed fields in one C call (InjectionPlan.from_runs).
 *
 * Built and loaded by native.py (plan.py falls back to its Python path where no C compiler is
 * found, and for any input this refuses, so that its PlanError says what is wrong):
 *
 *   pack(slab_keys, runs) -> (keys, packed_keys, lengths, packed_lengths, tokens)
 *
 *   slab_keys       list or tuple of ints, one per run
 *   runs            list of bytes: each run's token ids as little-endian int32 (pack_token_ids)
 *   keys            the slab keys as a tuple
 *   packed_keys     the keys as little-endian int64 bytes
 *   lengths         each run's token count, as a tuple
 *   packed_lengths  the counts as little-endian int32 bytes
 *   tokens          the runs joined
 *
 * Raises ValueError for no runs, a key count that differs from the run count, an empty run or
 * one whose size is not a multiple of 4 bytes; OverflowError for a key outside int64 or a run
 * of more than 2**31 - 1 ids; TypeError for arguments of other types.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if PY_BIG_ENDIAN
#error "plan_pack.c writes little-endian bytes by memcpy: build it on a little-endian host"
#endif

static PyObject *pack(PyObject *self, PyObject *args) {
    PyObject *keys_in, *runs_in;
    if (!PyArg_ParseTuple(args, "OO!", &keys_in, &PyList_Type, &runs_in)) return NULL;
    /* Snapshots (new references): no Python code can change what is read below. */
    PyObject *runs = PyList_AsTuple(runs_in);
    if (!runs) return NULL;
    PyObject *keys = PySequence_Tuple(keys_in);
    PyObject *packed_keys = NULL, *lengths = NULL, *packed_lengths = NULL, *tokens = NULL;
    if (!keys) goto fail;
    Py_ssize_t n = PyTuple_GET_SIZE(runs), total = 0;
    if (n == 0 || PyTuple_GET_SIZE(keys) != n) {
        PyErr_SetString(PyExc_ValueError, "a plan needs one slab key per run, at least one");
        goto fail;
    }
    packed_keys = PyBytes_FromStringAndSize(NULL, 8 * n);
    if (!packed_keys) goto fail;
    char *k = PyBytes_AS_STRING(packed_keys);
    for (Py_ssize_t i = 0; i < n; i++) { /* every key first: __index__ may run Python code */
        long long key = PyLong_AsLongLong(PyTuple_GET_ITEM(keys, i));
        if (key == -1 && PyErr_Occurred()) goto fail;
        int64_t key64 = key;
        memcpy(k + 8 * i, &key64, 8);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *run = PyTuple_GET_ITEM(runs, i);
        if (!PyBytes_Check(run)) {
            PyErr_SetString(PyExc_TypeError, "runs must be bytes");
            goto fail;
        }
        Py_ssize_t size = PyBytes_GET_SIZE(run);
        if (size == 0 || size % 4) {
            PyErr_SetString(PyExc_ValueError, "runs must be non-empty packed int32 ids");
            goto fail;
        }
        if (size / 4 > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "a run holds more than 2**31 - 1 ids");
            goto fail;
        }
        total += size;
    }
    packed_lengths = PyBytes_FromStringAndSize(NULL, 4 * n);
    tokens = PyBytes_FromStringAndSize(NULL, total);
    lengths = PyTuple_New(n);
    if (!packed_lengths || !tokens || !lengths) goto fail;
    char *l = PyBytes_AS_STRING(packed_lengths), *t = PyBytes_AS_STRING(tokens);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *run = PyTuple_GET_ITEM(runs, i);
        Py_ssize_t size = PyBytes_GET_SIZE(run);
        int32_t count = (int32_t)(size / 4);
        memcpy(l + 4 * i, &count, 4);
        PyObject *length = PyLong_FromLong(count);
        if (!length) goto fail;
        PyTuple_SET_ITEM(lengths, i, length);
        memcpy(t, PyBytes_AS_STRING(run), size);
        t += size;
    }
    Py_DECREF(runs);
    return Py_BuildValue("(NNNNN)", keys, packed_keys, lengths, packed_lengths, tokens);
fail:
    Py_DECREF(runs);
    Py_XDECREF(keys);
    Py_XDECREF(packed_keys);
    Py_XDECREF(lengths);
    Py_XDECREF(packed_lengths);
    Py_XDECREF(tokens);
    return NULL;
}

static PyMethodDef methods[] = {
    {"pack", pack, METH_VARARGS, "An injection plan's packed fields (see the source)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "inferscale_plan_pack", NULL, -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_inferscale_plan_pack(void) { return PyModule_Create(&module); }
