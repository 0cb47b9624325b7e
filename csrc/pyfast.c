/* Fast entries: Comm's Barrier/Bcast/Alltoall for the common case, as
 * CPython builtins bound to one communicator, so a call costs one C call
 * (no Python frame; a cffi call would also release and retake the GIL).
 * The buffer comes through the buffer protocol, the algorithm from the
 * size-class table; the GIL is released once a wait goes slow.  Anything
 * else (an explicit algorithm, a buffer spec, a bad argument) goes to the
 * Python method with its full checks and messages. */
#include <Python.h>
#include "sc_internal.h"

static int cls(int64_t n) { return n ? 64 - __builtin_clzll((uint64_t)n) : 0; }

/* An entry's self: (context address, Python method, error handler, {name:
 * algorithm id}).  The Python method is the same collective with every
 * check: it takes any call this entry declines; the handler turns a failed
 * rc into the exception. */
static sc_comm_t *ctx(PyObject *self) { return (sc_comm_t *)PyLong_AsVoidPtr(PyTuple_GET_ITEM(self, 0)); }

static PyObject *decline(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kw)
{
    PyErr_Clear();
    return PyObject_Vectorcall(PyTuple_GET_ITEM(self, 1), args, nargsf, kw);
}

/* Arguments: positional first, then keywords among names[]; 0 when the
 * call has anything else (the Python method will say what is wrong). */
static int parse(PyObject *const *args, size_t nargsf, PyObject *kw, const char *const *names, int max, PyObject **out)
{
    Py_ssize_t n = PyVectorcall_NARGS(nargsf), nk = kw ? PyTuple_GET_SIZE(kw) : 0;
    if (n > max) return 0;
    for (int i = 0; i < max; i++) out[i] = i < n ? args[i] : NULL;
    for (Py_ssize_t k = 0; k < nk; k++) {
        int i = 0;
        while (i < max && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kw, k), names[i])) i++;
        if (i == max || out[i]) return 0;
        out[i] = args[n + k];
    }
    return 1;
}

/* The algorithm id: the size-class table's for None, the named one else;
 * -1 for an unknown name. */
static int algorithm(PyObject *self, sc_comm_t *c, PyObject *name, int op, int64_t nbytes)
{
    if (!name || name == Py_None) return c->auto_alg[op * SC_NCLASS + cls(nbytes)];
    PyObject *id = PyDict_GetItemWithError(PyTuple_GET_ITEM(self, 3), name);
    return id ? (int)PyLong_AsLong(id) : -1;
}

static void arm(sc_comm_t *c) { c->gil_release = (void *)PyEval_SaveThread; }

/* Take the GIL back if a slow wait let it go: before anything touches a
 * Python object again (PyBuffer_Release included). */
static void resume(sc_comm_t *c)
{
    if (c->gil_saved) {
        PyEval_RestoreThread(c->gil_saved);
        c->gil_saved = NULL;
    }
    c->gil_release = NULL;
}

static PyObject *result(PyObject *self, int rc)
{
    if (!rc) Py_RETURN_NONE;
    PyObject *r = PyLong_FromLong(rc);
    if (!r) return NULL;
    PyObject *out = PyObject_CallOneArg(PyTuple_GET_ITEM(self, 2), r);
    Py_DECREF(r);
    return out;
}

/* Barrier(algorithm=None) */
static PyObject *py_barrier(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kw)
{
    static const char *const names[] = {"algorithm"};
    PyObject *a[1];
    sc_comm_t *c = ctx(self);
    int alg;
    if (c->closed || !parse(args, nargsf, kw, names, 1, a) || (alg = algorithm(self, c, a[0], 0, 0)) < 0)
        return decline(self, args, nargsf, kw);
    arm(c);
    int rc = sc_barrier(c, alg);
    resume(c);
    return result(self, rc);
}

/* Bcast(buf, root=0, algorithm=None): a writable C-contiguous buffer. */
static PyObject *py_bcast(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kw)
{
    static const char *const names[] = {"buf", "root", "algorithm"};
    PyObject *a[3];
    sc_comm_t *c = ctx(self);
    Py_buffer b;
    long root = 0;
    int alg;
    if (c->closed || !parse(args, nargsf, kw, names, 3, a) || !a[0]) return decline(self, args, nargsf, kw);
    if (a[1]) {
        if (!PyLong_CheckExact(a[1])) return decline(self, args, nargsf, kw);
        root = PyLong_AsLong(a[1]);
    }
    if (root < 0 || root >= c->size) return decline(self, args, nargsf, kw);
    if (PyObject_GetBuffer(a[0], &b, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS)) return decline(self, args, nargsf, kw);
    if ((alg = algorithm(self, c, a[2], 1, b.len)) < 0) {
        PyBuffer_Release(&b);
        return decline(self, args, nargsf, kw);
    }
    int rc = SC_OK;
    arm(c);
    if (c->check) rc = sc_check(c, 1, alg, root, b.len);
    if (!rc) rc = sc_bcast(c, alg, b.buf, b.len, (int32_t)root);
    resume(c);
    PyBuffer_Release(&b);
    return result(self, rc);
}

/* Alltoall(sendbuf, recvbuf, algorithm=None): equal, divisible, disjoint buffers. */
static PyObject *py_alltoall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kw)
{
    static const char *const names[] = {"sendbuf", "recvbuf", "algorithm"};
    PyObject *a[3];
    sc_comm_t *c = ctx(self);
    Py_buffer s, r;
    int alg;
    if (c->closed || !parse(args, nargsf, kw, names, 3, a) || !a[0] || !a[1]) return decline(self, args, nargsf, kw);
    if (PyObject_GetBuffer(a[0], &s, PyBUF_C_CONTIGUOUS)) return decline(self, args, nargsf, kw);
    if (PyObject_GetBuffer(a[1], &r, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS)) {
        PyBuffer_Release(&s);
        return decline(self, args, nargsf, kw);
    }
    char *sp = s.buf, *rp = r.buf;
    if (s.len != r.len || s.len % c->size || (s.len && sp < rp + r.len && rp < sp + s.len) ||
        (alg = algorithm(self, c, a[2], 2, s.len / c->size)) < 0) {
        PyBuffer_Release(&s);
        PyBuffer_Release(&r);
        return decline(self, args, nargsf, kw);
    }
    int64_t block = s.len / c->size;
    int rc = SC_OK;
    arm(c);
    if (c->check) rc = sc_check(c, 2, alg, -1, block);
    if (!rc) rc = sc_alltoall(c, alg, sp, rp, block);
    resume(c);
    PyBuffer_Release(&s);
    PyBuffer_Release(&r);
    return result(self, rc);
}

static PyMethodDef defs[] = {
    {"Barrier", (PyCFunction)(void (*)(void))py_barrier, METH_FASTCALL | METH_KEYWORDS, "Barrier(algorithm=None)"},
    {"Bcast", (PyCFunction)(void (*)(void))py_bcast, METH_FASTCALL | METH_KEYWORDS, "Bcast(buf, root=0, algorithm=None)"},
    {"Alltoall", (PyCFunction)(void (*)(void))py_alltoall, METH_FASTCALL | METH_KEYWORDS, "Alltoall(sendbuf, recvbuf, algorithm=None)"},
};

/* Entry i's method definition, for Python to bind to a context (its
 * address as `self`) with PyCFunction_NewEx. */
void *sc_py_entry(int i) { return i >= 0 && i < 3 ? &defs[i] : NULL; }
