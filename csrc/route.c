/* The multi-node face's Send and Recv (shmcoll/multinode/p2p.py, Routed):
 * a node-mate's message goes to the node's shmcoll entry, another node's
 * rank's to mpi4py's own method, chosen here in C.  The Python method
 * chooses alike in about 0.3 us, a tenth of MPI's small round trip
 * between virtual nodes; here it is the cost of one vectorcall.  Anything
 * but the common case (a plain C-contiguous numpy array, int rank and
 * tag, no status for a node-mate, nothing queued or pending) goes to the
 * Python method, which takes every case. */
#include <Python.h>
#include "sc_internal.h"

int sc_py_parse(PyObject *const *args, size_t nargsf, PyObject *kw, PyObject *names, PyObject **out);   /* pyfast.c */
int sc_py_array(PyObject *v, int writable, Py_buffer *b, PyObject **descr);

/* self: (recv (0/1), argument names, {rank: node-local rank}, the node's
 * entry, mpi4py's method, the face's communicator, the Python method,
 * the communicator's size, the route's queue, p2p._busy,
 * nonblocking._busy, MPIError, the function that raises its MPI.Exception,
 * the rank and tag an absent argument means) */
enum { R_RECV, R_NAMES, R_LOCAL, R_NODE, R_MPI, R_COMM, R_PY, R_SIZE, R_QUEUE, R_P2P, R_NBC, R_ERR, R_RAISE, R_RANK,
       R_TAG };

static PyObject *decline(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kw)
{
    PyErr_Clear();
    return PyObject_Vectorcall(PyTuple_GET_ITEM(self, R_PY), args, nargsf, kw);
}

/* A plain C-contiguous numpy array (writable for a receive). */
static int plain(PyObject *v, int writable)
{
    Py_buffer b;
    PyObject *descr = NULL;
    if (!sc_py_array(v, writable, &b, &descr)) return 0;
    if (b.obj) PyBuffer_Release(&b);
    return descr != NULL;
}

static PyObject *route(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kw)
{
    PyObject *a[4] = { NULL, NULL, NULL, NULL };
    int recv = PyTuple_GET_ITEM(self, R_RECV) == Py_True;
    if (!sc_py_parse(args, nargsf, kw, PyTuple_GET_ITEM(self, R_NAMES), a)) return decline(self, args, nargsf, kw);
    PyObject *buf = a[0], *rank = a[1] ? a[1] : PyTuple_GET_ITEM(self, R_RANK);
    PyObject *tag = a[2] ? a[2] : PyTuple_GET_ITEM(self, R_TAG), *status = recv && a[3] ? a[3] : Py_None;
    if (!buf || !PyLong_CheckExact(rank) || !PyLong_CheckExact(tag) || !plain(buf, recv)
        || PyList_GET_SIZE(PyTuple_GET_ITEM(self, R_QUEUE)))        /* a queued receive: its sweeps too */
        return decline(self, args, nargsf, kw);
    PyObject *local = PyDict_GetItemWithError(PyTuple_GET_ITEM(self, R_LOCAL), rank), *out;
    if (local) {
        if (status != Py_None) return decline(self, args, nargsf, kw);
        PyObject *call[3] = { buf, local, tag };
        out = PyObject_Vectorcall(PyTuple_GET_ITEM(self, R_NODE), call, 3, NULL);
        if (!out && PyErr_ExceptionMatches(PyTuple_GET_ITEM(self, R_ERR))) {
            PyObject *t, *v, *tb;
            PyErr_Fetch(&t, &v, &tb);
            PyErr_NormalizeException(&t, &v, &tb);
            PyObject *r = PyObject_CallOneArg(PyTuple_GET_ITEM(self, R_RAISE), v);     /* raises */
            Py_XDECREF(r);
            Py_XDECREF(t);
            Py_XDECREF(v);
            Py_XDECREF(tb);
        }
        return out;
    }
    if (PyErr_Occurred()) return decline(self, args, nargsf, kw);
    long r = PyLong_AsLong(rank);
    if (r < 0 || r >= PyLong_AsLong(PyTuple_GET_ITEM(self, R_SIZE)) || PyDict_GET_SIZE(PyTuple_GET_ITEM(self, R_P2P))
        || PyDict_GET_SIZE(PyTuple_GET_ITEM(self, R_NBC)))
        return decline(self, args, nargsf, kw);
    PyObject *call[5] = { PyTuple_GET_ITEM(self, R_COMM), buf, rank, tag, status };
    return PyObject_Vectorcall(PyTuple_GET_ITEM(self, R_MPI), call, recv ? 5 : 4, NULL);
}

static PyMethodDef def = { "route", (PyCFunction)(void (*)(void))route, METH_FASTCALL | METH_KEYWORDS,
                           "the face's Send or Recv: a node-mate's through shmcoll, another node's through MPI" };

void *sc_py_route(void) { return &def; }
