/* One load's injection index in one C call: the worker's per-request index math.
 *
 * Built by inferscale_engine/native.py, loaded by connector/native.py (the worker falls back to
 * its numpy path where no C compiler is found). It does exactly what
 * InferScaleWorker._load_indices does with numpy, minus the ~20 Python-level calls that cost
 * ~100-200 us per request on a busy serving host:
 *
 *   fill(entries, slab_keys, lengths, user_id, system_owner, lo, hi, block_ids, block_size,
 *        out, column) -> int
 *
 *   entries      dict slab key -> SlabEntry (owner, num_tokens, origin, rows_bytes)
 *   slab_keys    [S] int64: the plan's segments in prompt order; lengths [S] int64 their tokens
 *   lo, hi       the load covers prompt positions [lo, hi)
 *   block_ids    [B] int64: the request's block table (B * block_size >= hi)
 *   out          [4, W] int64, C-contiguous: columns [column, column + hi - lo) receive slab rows,
 *                paged slots, the positions the stored keys are rotated for (origin + i) and
 *                the serving positions
 *
 * Returns hi - lo, or -(i + 1) when segment i fails its check (not resident, owned by another
 * user, or stored with another length): the caller then fails the load. Raises ValueError on
 * buffers of another type or shape and on a load that reaches past the plan's segments.
 *
 * A slab entry's four fields are read straight from its slots when its type is the one the
 * first entry had (SlabEntry, a slots dataclass) and that type is unchanged since: the same
 * values as getattr, without a type lookup and a descriptor call per field (~0.1 us each with
 * cold caches, 4 per segment). Any other object, or a type that was modified, takes getattr.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

enum { OWNER, NUM_TOKENS, ORIGIN, ROWS_BYTES, NUM_FIELDS };
static PyObject *s_names[NUM_FIELDS];

/* The slot layout of one entry type: its slots' offsets, valid while the type's version tag is
 * the one seen when they were read (a modified type gets a new tag). */
static PyTypeObject *s_slots_type;
static unsigned int s_slots_version;
static Py_ssize_t s_offsets[NUM_FIELDS];

/* A C-contiguous int64 buffer of `ndim` dimensions (the caller releases it). */
static int int64_buffer(PyObject *obj, Py_buffer *view, int writable, int ndim, const char *what) {
    int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) return -1;
    const char *f = view->format ? view->format : "B";
    if (*f == '@' || *f == '=' || *f == '<') f++;
    if (view->itemsize != 8 || (strcmp(f, "q") && strcmp(f, "l")) || view->ndim != ndim) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s must be a C-contiguous %d-d int64 array", what, ndim);
        return -1;
    }
    return 0;
}

/* Learn `type`'s slot offsets if each field is its own object slot (a member descriptor of
 * T_OBJECT_EX defined by this very type); otherwise forget any layout. Never raises. */
static void learn_slots(PyTypeObject *type) {
    Py_ssize_t offsets[NUM_FIELDS];
    Py_CLEAR(s_slots_type);
    if (type->tp_getattro != PyObject_GenericGetAttr) return;
    for (int f = 0; f < NUM_FIELDS; f++) {
        PyObject *d = PyObject_GetAttr((PyObject *)type, s_names[f]);
        if (!d) {
            PyErr_Clear();
            return;
        }
        int ok = Py_IS_TYPE(d, &PyMemberDescr_Type)
                 && ((PyDescrObject *)d)->d_type == type
                 && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX;
        if (ok) offsets[f] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_DECREF(d);
        if (!ok) return;
    }
    if (!type->tp_version_tag) return; /* the lookups above assign one; none: no fast path */
    memcpy(s_offsets, offsets, sizeof offsets);
    s_slots_version = type->tp_version_tag;
    Py_INCREF(type);
    s_slots_type = type;
}

/* New references to `entry`'s four fields, or -1 with an exception set. */
static int entry_fields(PyObject *entry, PyObject **fields) {
    PyTypeObject *type = Py_TYPE(entry);
    if (type != s_slots_type || type->tp_version_tag != s_slots_version) learn_slots(type);
    if (type == s_slots_type) {
        int f = 0;
        for (; f < NUM_FIELDS; f++) {
            fields[f] = *(PyObject **)((char *)entry + s_offsets[f]);
            if (!fields[f]) break; /* an unset slot: getattr raises its AttributeError */
        }
        if (f == NUM_FIELDS) {
            for (f = 0; f < NUM_FIELDS; f++) Py_INCREF(fields[f]);
            return 0;
        }
    }
    for (int f = 0; f < NUM_FIELDS; f++) {
        fields[f] = PyObject_GetAttr(entry, s_names[f]);
        if (!fields[f]) {
            while (f--) Py_DECREF(fields[f]);
            return -1;
        }
    }
    return 0;
}

static int as_i64(PyObject *v, long long *out) {
    *out = PyLong_AsLongLong(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* 1 if `owner` may be read by `user` (its own entry, or the system's), 0 if not, -1 on error. */
static int readable(PyObject *owner, PyObject *user, PyObject *system) {
    if (!PyUnicode_Check(owner)) return 0;
    if (owner == user || owner == system) return 1;
    int same = PyUnicode_Compare(owner, user);
    if (same == -1 && PyErr_Occurred()) return -1;
    if (same == 0) return 1;
    same = PyUnicode_Compare(owner, system);
    if (same == -1 && PyErr_Occurred()) return -1;
    return same == 0;
}

/* Slab rows and rotation positions of the segments overlapping [lo, hi). Returns 0, i + 1 when
 * segment i fails its check, or -1 with an exception set. */
static long long fill_segments(PyObject *entries, const int64_t *keys, const int64_t *lengths,
                               Py_ssize_t num_segments, PyObject *user, PyObject *system,
                               long long lo, long long hi, int64_t *rows, int64_t *canonical) {
    long long pos = 0;
    for (Py_ssize_t i = 0; i < num_segments && pos < hi; i++) {
        if (lengths[i] <= 0 || lengths[i] > INT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "segment lengths must be in [1, 2**31)");
            return -1;
        }
        long long start = pos, end = pos + lengths[i];
        pos = end;
        if (end <= lo) continue;
        PyObject *key = PyLong_FromLongLong(keys[i]);
        if (!key) return -1;
        PyObject *entry = PyDict_GetItemWithError(entries, key);
        Py_DECREF(key);
        if (!entry) return PyErr_Occurred() ? -1 : i + 1;
        Py_INCREF(entry); /* held while its fields are read */
        PyObject *fields[NUM_FIELDS];
        int got = entry_fields(entry, fields);
        Py_DECREF(entry);
        if (got < 0) return -1;
        long long num_tokens = 0, origin = 0;
        PyObject *stored = NULL;
        if (!as_i64(fields[NUM_TOKENS], &num_tokens) && !as_i64(fields[ORIGIN], &origin)
            && readable(fields[OWNER], user, system) > 0 && num_tokens == lengths[i]) {
            stored = fields[ROWS_BYTES];
            Py_INCREF(stored);
        }
        for (int f = 0; f < NUM_FIELDS; f++) Py_DECREF(fields[f]);
        if (PyErr_Occurred()) {
            Py_XDECREF(stored);
            return -1;
        }
        if (!stored) return i + 1; /* another owner, or another length */
        if (!PyBytes_Check(stored) || PyBytes_GET_SIZE(stored) != 8 * num_tokens) {
            Py_DECREF(stored);
            PyErr_SetString(PyExc_ValueError, "a slab entry's rows_bytes does not hold its rows");
            return -1;
        }
        long long a = start > lo ? start : lo, b = end < hi ? end : hi;
        memcpy(rows + (a - lo), PyBytes_AS_STRING(stored) + 8 * (a - start), 8 * (b - a));
        Py_DECREF(stored);
        for (long long p = a; p < b; p++) canonical[p - lo] = origin + (p - start);
    }
    if (pos < hi) {
        PyErr_SetString(PyExc_ValueError, "the load reaches past the plan's segments");
        return -1;
    }
    return 0;
}

static PyObject *fill(PyObject *self, PyObject *args) {
    PyObject *entries, *user, *system, *keys_obj, *lengths_obj, *blocks_obj, *out_obj;
    PyObject *result = NULL;
    long long lo, hi, block_size, column;
    if (!PyArg_ParseTuple(args, "O!OOUULLOLOL", &PyDict_Type, &entries, &keys_obj, &lengths_obj,
                          &user, &system, &lo, &hi, &blocks_obj, &block_size, &out_obj, &column))
        return NULL;
    Py_buffer keys, lengths, blocks, out;
    if (int64_buffer(keys_obj, &keys, 0, 1, "slab_keys")) return NULL;
    if (int64_buffer(lengths_obj, &lengths, 0, 1, "lengths")) goto release_keys;
    if (int64_buffer(blocks_obj, &blocks, 0, 1, "block_ids")) goto release_lengths;
    if (int64_buffer(out_obj, &out, 1, 2, "out")) goto release_blocks;
    long long width = hi - lo, stride = out.shape[1];
    if (lengths.len != keys.len || lo < 0 || width < 0 || block_size <= 0 || out.shape[0] != 4
        || column < 0 || column + width > stride
        || (width > 0 && (hi - 1) / block_size >= blocks.len / 8)) {
        PyErr_SetString(PyExc_ValueError, "fill: sizes do not fit (segments, load, block table "
                                          "or out)");
        goto release;
    }
    int64_t *o = (int64_t *)out.buf + column;
    long long failed = fill_segments(entries, keys.buf, lengths.buf, keys.len / 8, user, system,
                                     lo, hi, o, o + 2 * stride);
    if (failed < 0) goto release;
    if (failed > 0) {
        result = PyLong_FromLongLong(-failed);
        goto release;
    }
    const int64_t *table = blocks.buf;
    int64_t *slots = o + stride, *serving = o + 3 * stride;
    for (long long p = lo; p < hi; p++) {
        slots[p - lo] = table[p / block_size] * block_size + p % block_size;
        serving[p - lo] = p;
    }
    result = PyLong_FromLongLong(width);
release:
    PyBuffer_Release(&out);
release_blocks:
    PyBuffer_Release(&blocks);
release_lengths:
    PyBuffer_Release(&lengths);
release_keys:
    PyBuffer_Release(&keys);
    return result;
}

static PyMethodDef methods[] = {
    {"fill", fill, METH_VARARGS, "Write one load's [4, hi - lo] injection index (see the source)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "inferscale_load_index", NULL, -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_inferscale_load_index(void) {
    static const char *names[NUM_FIELDS] = {"owner", "num_tokens", "origin", "rows_bytes"};
    for (int f = 0; f < NUM_FIELDS; f++)
        if (!(s_names[f] = PyUnicode_InternFromString(names[f]))) return NULL;
    return PyModule_Create(&module);
}
