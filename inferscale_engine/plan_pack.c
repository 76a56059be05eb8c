/* An injection plan's wire format in C: packed on the app side, bound on the scheduler's.
 *
 * Built and loaded by native.py (plan.py falls back to its Python path where no C compiler is
 * found, and for any input these refuse, so that its PlanError says what is wrong):
 *
 *   pack(slab_keys, runs) -> (keys, packed_keys, lengths, packed_lengths, tokens)
 *   bind(entry, prompt, version) -> None | (user, salt, mac, keys, lengths, packed_keys,
 *                                          packed_lengths, tokens, payload)
 *
 * pack (InjectionPlan.from_runs):
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
 *
 * bind (plan.bound_plan: the scheduler's check of a signed plan, MP=1 and the OpenAI server):
 *
 *   entry      kv_transfer_params["inferscale"] as sent by to_params (a dict)
 *   prompt     the request's prompt token ids (a list of ints)
 *   version    PLAN_VERSION
 *   tokens     the prompt's first sum(lengths) ids as little-endian int32 (in place of the
 *              plan's own, which are never decoded: the MAC binds the prompt's ids)
 *   payload    the bytes InjectionPlan._payload(tokens) would hash
 *
 * What InjectionPlan.bound's Python path computes, in one call, for a well-formed
 * inject plan of the current version whose prompt holds its tokens. Anything else returns None
 * (fields of other types, base64 that is not canonical, a prompt too short or with ids outside
 * int32, strings that are not valid UTF-8): the Python path then decides, so this never accepts
 * what it would refuse, and the MAC is compared by the caller.
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


/* Strict base64 (what base64.b64decode(validate=True) accepts and our encoder writes: the
 * standard alphabet, 4-character groups, at most two '=' at the end). NULL with no exception
 * set for anything else. */
static PyObject *b64decode(PyObject *text) {
    if (!PyUnicode_CheckExact(text) || !PyUnicode_IS_ASCII(text)) return NULL;
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    const unsigned char *s = PyUnicode_1BYTE_DATA(text);
    if (n % 4) return NULL;
    Py_ssize_t pad = (n >= 1 && s[n - 1] == '=') + (n >= 2 && s[n - 2] == '=');
    PyObject *out = PyBytes_FromStringAndSize(NULL, n / 4 * 3 - pad);
    if (!out) return NULL;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i += 4) {
        uint32_t group = 0;
        for (int j = 0; j < 4; j++) {
            unsigned char c = s[i + j];
            int v = c >= 'A' && c <= 'Z' ? c - 'A' : c >= 'a' && c <= 'z' ? c - 'a' + 26
                  : c >= '0' && c <= '9' ? c - '0' + 52 : c == '+' ? 62 : c == '/' ? 63 : -1;
            if (v < 0) {
                if (c != '=' || i + j < n - pad) { /* '=' only as the final padding */
                    Py_DECREF(out);
                    return NULL;
                }
                v = 0;
            }
            group = group << 6 | (uint32_t)v;
        }
        Py_ssize_t at = i / 4 * 3, left = n / 4 * 3 - pad - at;
        if (left > 0) o[at] = (unsigned char)(group >> 16);
        if (left > 1) o[at + 1] = (unsigned char)(group >> 8);
        if (left > 2) o[at + 2] = (unsigned char)group;
    }
    return out;
}

static PyObject *s_v, *s_kind, *s_user, *s_salt, *s_mac, *s_keys, *s_lengths, *s_tokens;

/* entry[name] as a new reference, or NULL (missing, or the lookup raised). */
static PyObject *item(PyObject *entry, PyObject *name) {
    PyObject *v = PyDict_GetItemWithError(entry, name);
    Py_XINCREF(v); /* held: a later lookup may run a key's __eq__ */
    return v;
}

/* entry[name] as a new reference if it is an exact str, else NULL. */
static PyObject *str_item(PyObject *entry, PyObject *name) {
    PyObject *v = item(entry, name);
    if (v && !PyUnicode_CheckExact(v)) Py_CLEAR(v);
    return v;
}

static PyObject *bind(PyObject *self, PyObject *args) {
    PyObject *entry, *prompt;
    long version;
    if (!PyArg_ParseTuple(args, "OOl", &entry, &prompt, &version)) return NULL;
    if (!PyDict_CheckExact(entry) || !PyList_CheckExact(prompt)) Py_RETURN_NONE;
    /* New references to every field first: nothing read below can change. */
    PyObject *v = item(entry, s_v), *kind = str_item(entry, s_kind);
    PyObject *user = str_item(entry, s_user), *salt = str_item(entry, s_salt);
    PyObject *mac = str_item(entry, s_mac), *keys_text = str_item(entry, s_keys);
    PyObject *lengths_text = str_item(entry, s_lengths), *tokens_text = str_item(entry, s_tokens);
    PyObject *packed_keys = NULL, *packed_lengths = NULL, *keys = NULL, *lengths = NULL;
    PyObject *tokens = NULL, *payload = NULL, *result = NULL;
    if (!v || !PyLong_CheckExact(v) || PyLong_AsLong(v) != version || !kind
        || PyUnicode_CompareWithASCIIString(kind, "inject") || !user || !salt || !mac
        || !keys_text || !lengths_text || !tokens_text)
        goto done;
    packed_keys = b64decode(keys_text);
    packed_lengths = packed_keys ? b64decode(lengths_text) : NULL;
    if (!packed_lengths) goto done;
    Py_ssize_t count = PyBytes_GET_SIZE(packed_keys) / 8;
    if (count == 0 || PyBytes_GET_SIZE(packed_keys) % 8
        || PyBytes_GET_SIZE(packed_lengths) != 4 * count)
        goto done;
    keys = PyTuple_New(count);
    lengths = PyTuple_New(count);
    if (!keys || !lengths) goto done;
    const char *k = PyBytes_AS_STRING(packed_keys), *l = PyBytes_AS_STRING(packed_lengths);
    long long total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t key;
        int32_t length;
        memcpy(&key, k + 8 * i, 8);
        memcpy(&length, l + 4 * i, 4);
        if (key < 0 || length <= 0) goto done;
        total += length;
        PyObject *key_obj = PyLong_FromLongLong(key), *length_obj = PyLong_FromLong(length);
        if (!key_obj || !length_obj) {
            Py_XDECREF(key_obj);
            Py_XDECREF(length_obj);
            goto done;
        }
        PyTuple_SET_ITEM(keys, i, key_obj);
        PyTuple_SET_ITEM(lengths, i, length_obj);
    }
    /* The size of 'tokens' as from_params(tokens=False) reckons it, without decoding it. */
    Py_ssize_t encoded = PyUnicode_GET_LENGTH(tokens_text);
    Py_ssize_t size = 3 * (encoded / 4);
    for (Py_ssize_t i = encoded >= 2 ? encoded - 2 : 0; i < encoded; i++)
        size -= PyUnicode_READ_CHAR(tokens_text, i) == '=';
    if (total * 4 != size || total > PyList_GET_SIZE(prompt)) goto done;
    Py_ssize_t user_len, salt_len;
    const char *user_utf8 = PyUnicode_AsUTF8AndSize(user, &user_len);
    const char *salt_utf8 = user_utf8 ? PyUnicode_AsUTF8AndSize(salt, &salt_len) : NULL;
    if (!salt_utf8) goto done; /* lone surrogates: the Python path encodes them */
    tokens = PyBytes_FromStringAndSize(NULL, 4 * total);
    if (!tokens) goto done;
    char *t = PyBytes_AS_STRING(tokens);
    for (Py_ssize_t i = 0; i < total; i++) {
        PyObject *id = PyList_GET_ITEM(prompt, i);
        if (!PyLong_CheckExact(id)) goto done;
        long value = PyLong_AsLong(id);
        if ((value == -1 && PyErr_Occurred()) || value < INT32_MIN || value > INT32_MAX) goto done;
        int32_t id32 = (int32_t)value;
        memcpy(t + 4 * i, &id32, 4);
    }
    /* b"inject|%d|%d:" user b"|%d:" salt b"|%d|", as InjectionPlan._payload writes it (three
     * numbers of at most 20 digits each fit in 128 bytes; the checks guard the arithmetic). */
    char header[128];
    int head = snprintf(header, sizeof header, "inject|%ld|%zd:", version, user_len);
    if (head < 0 || head >= 48) goto done;
    int middle = snprintf(header + head, sizeof header - head, "|%zd:", salt_len);
    if (middle < 0 || middle >= 40) goto done;
    int tail_at = head + middle;
    int tail = snprintf(header + tail_at, sizeof header - tail_at, "|%zd|", count);
    if (tail < 0 || tail >= 40) goto done;
    payload = PyBytes_FromStringAndSize(NULL, tail_at + tail + user_len + salt_len + 12 * count
                                                  + 4 * total);
    if (!payload) goto done;
    char *p = PyBytes_AS_STRING(payload);
    memcpy(p, header, head);
    p += head;
    memcpy(p, user_utf8, user_len);
    p += user_len;
    memcpy(p, header + head, middle);
    p += middle;
    memcpy(p, salt_utf8, salt_len);
    p += salt_len;
    memcpy(p, header + tail_at, tail);
    p += tail;
    memcpy(p, k, 8 * count);
    p += 8 * count;
    memcpy(p, l, 4 * count);
    p += 4 * count;
    memcpy(p, t, 4 * total);
    result = PyTuple_Pack(9, user, salt, mac, keys, lengths, packed_keys, packed_lengths, tokens,
                          payload);
done:
    if (!result && PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_MemoryError))
        PyErr_Clear(); /* refused (an encoding error, an id out of range): None */
    Py_XDECREF(v);
    Py_XDECREF(kind);
    Py_XDECREF(user);
    Py_XDECREF(salt);
    Py_XDECREF(mac);
    Py_XDECREF(keys_text);
    Py_XDECREF(lengths_text);
    Py_XDECREF(tokens_text);
    Py_XDECREF(packed_keys);
    Py_XDECREF(packed_lengths);
    Py_XDECREF(keys);
    Py_XDECREF(lengths);
    Py_XDECREF(tokens);
    Py_XDECREF(payload);
    if (result || PyErr_Occurred()) return result;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"pack", pack, METH_VARARGS, "An injection plan's packed fields (see the source)."},
    {"bind", bind, METH_VARARGS, "A signed inject plan bound to its prompt (see the source)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "inferscale_plan_pack", NULL, -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_inferscale_plan_pack(void) {
    PyObject **names[] = {&s_v, &s_kind, &s_user, &s_salt, &s_mac, &s_keys, &s_lengths, &s_tokens};
    const char *spelled[] = {"v", "kind", "user", "salt", "mac", "keys", "lengths", "tokens"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!(*names[i] = PyUnicode_InternFromString(spelled[i]))) return NULL;
    return PyModule_Create(&module);
}
