/* The hierarchical communicator's small collectives (shmcoll/multinode/
 * hier.py), straight to the MPI library's C function.
 *
 * Below FLAT_BELOW the legs lose to the library's own call, so the call is
 * the library's; through mpi4py it costs 0.2 us of argument handling per
 * call on top of MPI's own (an 8 B Bcast on COMM_SELF: 0.28 us against a
 * Barrier's 0.05), and a Python size check in front of it 0.15 more: with
 * 4 ranks on 2 CPUs these add up to a third of Open MPI's 1.1 us Bcast.
 * Here one C function per collective reads plain numpy arrays, makes the
 * size check and calls MPI's function with the GIL let go, as mpi4py does;
 * anything else (specs, other buffers, user ops, sizes for the legs) goes
 * to the Python method, which decides alike on sizes, so every rank
 * calls the same collective whichever way it came.
 *
 * The library's handles are ints (MPICH) or pointers (Open MPI): each call
 * is made through a function type of the right width (wide). */
#include <Python.h>
#include "sc_internal.h"

enum { F_BARRIER, F_BCAST, F_REDUCE, F_ALLREDUCE, F_ALLGATHER, F_ALLTOALL, F_GATHER, F_SCATTER, F_RSB };

/* self: (a bytearray holding an sc_flat_t (core.h), the Python method,
 * argument names, {numpy dtype: (datatype handle, itemsize)}, (the
 * built-in ops, SUM first), (their handles), MPI.Exception, MPI.IN_PLACE) */

int sc_py_parse(PyObject *const *args, size_t nargsf, PyObject *kw, PyObject *names, PyObject **out);   /* pyfast.c */
int sc_py_array(PyObject *v, int writable, Py_buffer *b, PyObject **descr);

typedef int (*barrier_w)(intptr_t);
typedef int (*barrier_n)(int);
typedef int (*bcast_w)(void *, int, intptr_t, int, intptr_t);
typedef int (*bcast_n)(void *, int, int, int, int);
typedef int (*reduce_w)(const void *, void *, int, intptr_t, intptr_t, int, intptr_t);
typedef int (*reduce_n)(const void *, void *, int, int, int, int, int);
typedef int (*allreduce_w)(const void *, void *, int, intptr_t, intptr_t, intptr_t);
typedef int (*allreduce_n)(const void *, void *, int, int, int, int);
typedef int (*allgather_w)(const void *, int, intptr_t, void *, int, intptr_t, intptr_t);
typedef int (*allgather_n)(const void *, int, int, void *, int, int, int);
typedef int (*gather_w)(const void *, int, intptr_t, void *, int, intptr_t, int, intptr_t);
typedef int (*gather_n)(const void *, int, int, void *, int, int, int, int);

/* A call the C path does not take: the Python method's. */
static PyObject *decline(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kw)
{
    PyErr_Clear();
    return PyObject_Vectorcall(PyTuple_GET_ITEM(self, 1), args, nargsf, kw);
}

static int in_place(PyObject *self, PyObject *v) { return v == Py_None || v == PyTuple_GET_ITEM(self, 7); }

/* op's handle among the built-in ops (by identity; absent: SUM, the first); 0 if it is none of them. */
static int op_handle(PyObject *self, PyObject *op, intptr_t *h)
{
    PyObject *ops = PyTuple_GET_ITEM(self, 4), *hs = PyTuple_GET_ITEM(self, 5);
    if (!op) op = PyTuple_GET_ITEM(ops, 0);        /* None is none of them: mpi4py refuses it */
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(ops); i++)
        if (PyTuple_GET_ITEM(ops, i) == op) {
            *h = (intptr_t)PyLong_AsSsize_t(PyTuple_GET_ITEM(hs, i));
            return 1;
        }
    return 0;
}

static void release(Py_buffer *b)
{
    if (b->obj) PyBuffer_Release(b);
    b->obj = NULL;
}

/* None, or MPI.Exception(rc) raised, as mpi4py raises an error the library returned. */
static PyObject *done(PyObject *self, int rc)
{
    if (!rc) Py_RETURN_NONE;
    PyObject *exc = PyTuple_GET_ITEM(self, 6), *e = PyObject_CallFunction(exc, "i", rc);
    if (e) {
        PyErr_SetObject(exc, e);
        Py_DECREF(e);
    }
    return NULL;
}

/* This rank's buffer v (an array; absent: none, when not wanted) into b; 0 if it is not one the C path takes. */
static int take(PyObject *v, int wanted, int writable, Py_buffer *b, PyObject **descr)
{
    b->obj = NULL, b->buf = NULL, b->len = 0, *descr = NULL;
    return !wanted || sc_py_array(v, writable, b, descr);
}

static PyObject *flat(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kw)
{
    const sc_flat_t *f = (const sc_flat_t *)PyByteArray_AS_STRING(PyTuple_GET_ITEM(self, 0));
    PyObject *a[4] = { NULL }, *sd, *rd;
    Py_buffer sb, rb;
    int k = f->kind, root = 0, p = f->size, me;
    intptr_t op = 0, type = f->byte;
    if (!sc_py_parse(args, nargsf, kw, PyTuple_GET_ITEM(self, 2), a)) return decline(self, args, nargsf, kw);
    /* a buffer the signature requires and the call left out: Python's TypeError (absent is not IN_PLACE) */
    if (k != F_BARRIER && (!a[0] || (k != F_BCAST && k != F_REDUCE && k != F_GATHER && !a[1])))
        return decline(self, args, nargsf, kw);
    if (k == F_BARRIER) {
        if (f->below <= 0) return decline(self, args, nargsf, kw);
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = f->wide ? ((barrier_w)f->fn)(f->comm) : ((barrier_n)f->fn)((int)f->comm);
        Py_END_ALLOW_THREADS
        return done(self, rc);
    }
    int reduction = k == F_REDUCE || k == F_ALLREDUCE || k == F_RSB;
    int rooted = k == F_BCAST ? 1 : k == F_REDUCE ? 3 : k == F_GATHER || k == F_SCATTER ? 2 : -1;
    if (rooted >= 0 && a[rooted]) {
        if (!PyLong_CheckExact(a[rooted])) return decline(self, args, nargsf, kw);
        long r = PyLong_AsLong(a[rooted]);
        if (r < 0 || r >= p) return decline(self, args, nargsf, kw);     /* MPI's own refuses it */
        root = (int)r;
    }
    me = f->rank == root;
    if (reduction && !op_handle(self, a[2], &op)) return decline(self, args, nargsf, kw);
    /* which buffers this rank passes (ip: sendbuf IN_PLACE), and the size
     * check as hier.py's Python methods make it: check < below * scale */
    int ip = k != F_BCAST && in_place(self, a[0]), want_s, want_r;
    if (k == F_BCAST) want_s = 1, want_r = 0;
    else if (k == F_SCATTER) ip = me && in_place(self, a[1]), want_s = me, want_r = !ip;
    else if (k == F_REDUCE || k == F_GATHER) want_s = !ip, want_r = me;
    else want_s = !ip, want_r = 1;
    if (ip && !me && (k == F_REDUCE || k == F_GATHER)) return decline(self, args, nargsf, kw);
    if (!take(a[0], want_s, k == F_BCAST && !me, &sb, &sd)) return decline(self, args, nargsf, kw);
    if (!take(a[1], want_r, 1, &rb, &rd)) {
        release(&sb);
        return decline(self, args, nargsf, kw);
    }
    Py_ssize_t sn = sb.len, rn = rb.len, check = 0, scale = 1;
    switch (k) {
    case F_BCAST: check = sn; break;
    case F_REDUCE: check = ip ? rn : sn; break;
    case F_ALLREDUCE: check = rn; break;
    case F_ALLGATHER: case F_ALLTOALL: check = rn, scale = p; break;
    case F_GATHER: check = ip ? rn : sn, scale = ip ? p : 1; break;
    case F_SCATTER: check = ip ? sn : rn, scale = ip ? p : 1; break;
    default: check = rn, scale = ip ? p : 1; break;            /* F_RSB */
    }
    int64_t isz[2] = { 1, 1 }, scount = 0, rcount = 0;
    int ok = check < f->below * scale;        /* below is at most 2^31 (flatc.py): no overflow */
    /* numpy arrays of dtypes mpi4py maps to a datatype (it refuses a
     * struct's, which the bytes would carry); a reduction's of one dtype,
     * in its datatype, the others' as bytes */
    for (int i = 0; ok && i < 2; i++) {
        PyObject *d = i ? rd : sd, *h;
        if (!(i ? want_r : want_s)) continue;
        ok = d && (h = PyDict_GetItemWithError(PyTuple_GET_ITEM(self, 3), d))
             && (isz[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(h, 1))) > 0 && (i ? rn : sn) % isz[i] == 0;
        if (ok && reduction) {
            ok = !sd || !rd || sd == rd;
            type = (intptr_t)PyLong_AsSsize_t(PyTuple_GET_ITEM(h, 0));
        }
    }
    /* the counts, each side's from its own buffer and checked in items as
     * mpi4py checks them: bytes, or a reduction's items; what mpi4py
     * refuses goes to it */
    int64_t si = sn / isz[0], ri = rn / isz[1];
    if (ok) {
        switch (k) {
        case F_BCAST: scount = sn; break;
        case F_REDUCE: scount = ip ? ri : si, ok = !me || ip || si == ri; break;
        case F_ALLREDUCE: scount = ri, ok = ip || si == ri; break;
        case F_RSB: scount = ip ? ri / p : ri, ok = ip ? ri % p == 0 : si == ri * p; break;
        case F_ALLGATHER: scount = ip ? 0 : sn, rcount = ri / p * isz[1], ok = ri % p == 0; break;
        case F_ALLTOALL:
            scount = ip ? 0 : si / p * isz[0], rcount = ri / p * isz[1], ok = ri % p == 0 && (ip || si % p == 0);
            break;
        case F_GATHER: scount = ip ? 0 : sn, rcount = me ? ri / p * isz[1] : 0, ok = !me || ri % p == 0; break;
        default: scount = me ? si / p * isz[0] : 0, rcount = ip ? 0 : rn, ok = !me || si % p == 0; break;  /* F_SCATTER */
        }
        ok = ok && scount <= INT32_MAX && rcount <= INT32_MAX;
    }
    if (!ok) {
        release(&sb);
        release(&rb);
        return decline(self, args, nargsf, kw);
    }
    void *s = ip && k != F_SCATTER ? (void *)f->in_place : sb.buf, *r = rb.buf;
    int w = f->wide, sc = (int)scount, rc_ = (int)rcount, rc = 0;
    Py_BEGIN_ALLOW_THREADS
    switch (k) {
    case F_BCAST:
        rc = w ? ((bcast_w)f->fn)(s, sc, type, root, f->comm) : ((bcast_n)f->fn)(s, sc, (int)type, root, (int)f->comm);
        break;
    case F_REDUCE:
        rc = w ? ((reduce_w)f->fn)(s, r, sc, type, op, root, f->comm)
               : ((reduce_n)f->fn)(s, r, sc, (int)type, (int)op, root, (int)f->comm);
        break;
    case F_ALLREDUCE: case F_RSB:
        rc = w ? ((allreduce_w)f->fn)(s, r, sc, type, op, f->comm)
               : ((allreduce_n)f->fn)(s, r, sc, (int)type, (int)op, (int)f->comm);
        break;
    case F_ALLGATHER: case F_ALLTOALL:
        rc = w ? ((allgather_w)f->fn)(s, sc, type, r, rc_, type, f->comm)
               : ((allgather_n)f->fn)(s, sc, (int)type, r, rc_, (int)type, (int)f->comm);
        break;
    default:        /* F_GATHER, F_SCATTER */
        if (k == F_SCATTER && ip) r = (void *)f->in_place;
        rc = w ? ((gather_w)f->fn)(s, sc, type, r, rc_, type, root, f->comm)
               : ((gather_n)f->fn)(s, sc, (int)type, r, rc_, (int)type, root, (int)f->comm);
        break;
    }
    Py_END_ALLOW_THREADS
    release(&sb);
    release(&rb);
    return done(self, rc);
}

static PyMethodDef def = { "flat", (PyCFunction)(void (*)(void))flat, METH_FASTCALL | METH_KEYWORDS,
                           "a small collective of the hierarchical communicator: MPI's own, from C" };

void *sc_py_flat(void) { return &def; }
