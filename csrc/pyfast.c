/* Fast entries for the API layer's common case, in the CPython API: the
 * buffer comes through the buffer protocol and the automatic choice from
 * the size-class table, with the GIL held (a cffi call would release and
 * retake it every time); the GIL is released once a wait goes slow.
 * Anything unusual (a buffer spec, a bad argument) returns SC_FALLBACK and
 * the Python layer redoes the call with its full checks and messages. */
#include <Python.h>
#include "sc_internal.h"

static int cls(int64_t n) { return n ? 64 - __builtin_clzll((uint64_t)n) : 0; }

static sc_comm_t *ctx(PyObject *self) { return (sc_comm_t *)PyLong_AsVoidPtr(self); }

/* Pick the algorithm: an explicit id, or the table's for this size class. */
static int pick(sc_comm_t *c, int op, long alg, int64_t nbytes) { return alg >= 0 ? (int)alg : c->auto_alg[op * SC_NCLASS + cls(nbytes)]; }

static PyObject *done(sc_comm_t *c, int rc)
{
    if (c->gil_saved) {
        PyEval_RestoreThread(c->gil_saved);
        c->gil_saved = NULL;
    }
    c->gil_release = NULL;
    return PyLong_FromLong(rc);
}

static void arm(sc_comm_t *c) { c->gil_release = (void *)PyEval_SaveThread; }

static PyObject *fallback(void)
{
    PyErr_Clear();
    return PyLong_FromLong(SC_FALLBACK);
}

/* barrier(alg) */
static PyObject *py_barrier(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    sc_comm_t *c = ctx(self);
    long alg = n > 0 ? PyLong_AsLong(args[0]) : -1;
    if (alg < -1 || alg > 2) return fallback();
    arm(c);
    return done(c, sc_barrier(c, pick(c, 0, alg, 0)));
}

/* bcast(buf, root, alg) */
static PyObject *py_bcast(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    sc_comm_t *c = ctx(self);
    Py_buffer b;
    if (n != 3 || !PyLong_CheckExact(args[1])) return fallback();
    long root = PyLong_AsLong(args[1]), alg = PyLong_AsLong(args[2]);
    if (root < 0 || root >= c->size || alg < -1 || alg > 3) return fallback();
    if (PyObject_GetBuffer(args[0], &b, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS)) return fallback();
    int rc = SC_OK;
    arm(c);
    if (c->check) rc = sc_check(c, 1, root, b.len);
    if (!rc) rc = sc_bcast(c, pick(c, 1, alg, b.len), b.buf, b.len, (int32_t)root);
    PyObject *r = done(c, rc);
    PyBuffer_Release(&b);
    return r;
}

/* alltoall(sendbuf, recvbuf, alg) */
static PyObject *py_alltoall(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    sc_comm_t *c = ctx(self);
    Py_buffer s, r;
    if (n != 3) return fallback();
    long alg = PyLong_AsLong(args[2]);
    if (alg < -1 || alg > 3) return fallback();
    if (PyObject_GetBuffer(args[0], &s, PyBUF_C_CONTIGUOUS)) return fallback();
    if (PyObject_GetBuffer(args[1], &r, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS)) {
        PyBuffer_Release(&s);
        return fallback();
    }
    char *sp = s.buf, *rp = r.buf;
    if (s.len != r.len || s.len % c->size || (s.len && sp < rp + r.len && rp < sp + s.len)) {
        PyBuffer_Release(&s);
        PyBuffer_Release(&r);
        return fallback();
    }
    int64_t block = s.len / c->size;
    int rc = SC_OK;
    arm(c);
    if (c->check) rc = sc_check(c, 2, -1, block);
    if (!rc) rc = sc_alltoall(c, pick(c, 2, alg, block), sp, rp, block);
    PyObject *res = done(c, rc);
    PyBuffer_Release(&s);
    PyBuffer_Release(&r);
    return res;
}

static PyMethodDef defs[] = {
    {"barrier", (PyCFunction)(void (*)(void))py_barrier, METH_FASTCALL, "barrier(alg)"},
    {"bcast", (PyCFunction)(void (*)(void))py_bcast, METH_FASTCALL, "bcast(buf, root, alg)"},
    {"alltoall", (PyCFunction)(void (*)(void))py_alltoall, METH_FASTCALL, "alltoall(sendbuf, recvbuf, alg)"},
};

/* Entry i's method definition, for Python to bind to a context (its
 * address as `self`) with PyCFunction_NewEx. */
void *sc_py_entry(int i) { return i >= 0 && i < 3 ? &defs[i] : NULL; }
