/* Python entries of the executor, as CPython builtins (a cffi call would
 * release and retake the GIL on every call):
 *  - entry(): one per collective method of a Comm (Barrier, Bcast, ...),
 *    generic over collectives: it parses the arguments by a role string,
 *    looks the compiled program up in the communicator's cache and runs it,
 *    so a common call costs one C call and no Python frame.  Anything else
 *    (a miss, a buffer spec, a read-only buffer, a bad argument) goes to the
 *    Python method, which checks, plans, fills the cache and runs exec().
 *  - exec(): run a given program on given buffer addresses.
 * Both release the GIL once a wait goes slow and poll for signals there, so
 * Ctrl-C interrupts a waiting rank. */
#include <Python.h>
#include "sc_internal.h"

static uint64_t hash_key(const int64_t *k)
{
    uint64_t h = 0x9e3779b97f4a7c15ULL;
    for (int i = 0; i < 6; i++) h = (h ^ (uint64_t)k[i]) * 0xbf58476d1ce4e5b9ULL;
    return h ^ (h >> 31);
}
int sc_cache_slot(const int64_t *key) { return (int)(hash_key(key) % SC_CACHE); }

static const int64_t *lookup(sc_comm_t *c, const int64_t *key)
{
    sc_entry_t *e = &c->cache[sc_cache_slot(key)];
    return e->prog && !memcmp(e->key, key, sizeof e->key) ? e->prog : NULL;
}

/* Called by the slow wait every few ms with the GIL released: run Python's
 * signal handlers; nonzero when one raised (the exception stays set). */
static int poll_signals(sc_comm_t *c)
{
    if (!c->gil_saved) return 0;
    PyEval_RestoreThread(c->gil_saved);
    int raised = PyErr_CheckSignals() < 0;
    c->gil_saved = PyEval_SaveThread();
    return raised;
}

static void arm(sc_comm_t *c)
{
    c->gil_release = (void *)PyEval_SaveThread;
    c->poll = (void *)poll_signals;
}

/* Take the GIL back if a slow wait let it go: before anything touches a
 * Python object again (PyBuffer_Release included). */
static void resume(sc_comm_t *c)
{
    if (c->gil_saved) {
        PyEval_RestoreThread(c->gil_saved);
        c->gil_saved = NULL;
    }
    c->gil_release = NULL;
    c->poll = NULL;
}

/* One call, owned by this thread for its length: a second thread gets
 * SC_EBUSY before it touches the context (the saved thread state, the
 * entry points), so it can neither resume the first one's GIL nor run. */
static int run(sc_comm_t *c, const int64_t *prog, char *sbuf, char *rbuf)
{
    if (__atomic_exchange_n(&c->busy, 1, __ATOMIC_ACQUIRE)) return SC_EBUSY;
    arm(c);
    int rc = sc_exec_owned(c, prog, sbuf, rbuf);
    resume(c);
    __atomic_store_n(&c->busy, 0, __ATOMIC_RELEASE);
    return rc;
}

/* An entry's self: (context address, Python method, error handler,
 * {name: algorithm id}, (collective id, roles, argument names)).  Roles, one
 * per argument: 'x' a buffer read on the root and written elsewhere, 'i'
 * read, 'o' written, 'r' the root, 'a' the algorithm. */
static sc_comm_t *ctx(PyObject *self) { return (sc_comm_t *)PyLong_AsVoidPtr(PyTuple_GET_ITEM(self, 0)); }

static PyObject *decline(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kw)
{
    PyErr_Clear();
    return PyObject_Vectorcall(PyTuple_GET_ITEM(self, 1), args, nargsf, kw);
}

#define MAXARGS 8

/* Arguments: positional first, then keywords among names; 0 when the call
 * has anything else (the Python method will say what is wrong). */
static int parse(PyObject *const *args, size_t nargsf, PyObject *kw, PyObject *names, PyObject **out)
{
    Py_ssize_t n = PyVectorcall_NARGS(nargsf), nk = kw ? PyTuple_GET_SIZE(kw) : 0, max = PyTuple_GET_SIZE(names);
    if (n > max || max > MAXARGS) return 0;
    for (Py_ssize_t i = 0; i < max; i++) out[i] = i < n ? args[i] : NULL;
    for (Py_ssize_t k = 0; k < nk; k++) {
        Py_ssize_t i = 0;
        while (i < max && PyUnicode_Compare(PyTuple_GET_ITEM(kw, k), PyTuple_GET_ITEM(names, i))) i++;
        if (i == max || out[i]) return 0;
        out[i] = args[n + k];
    }
    return 1;
}

static int plain(const Py_buffer *b) { return !b->format || !strchr(b->format, 'O'); }

static PyObject *entry(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kw)
{
    sc_comm_t *c = ctx(self);
    PyObject *desc = PyTuple_GET_ITEM(self, 4), *a[MAXARGS];
    const char *roles = PyUnicode_AsUTF8(PyTuple_GET_ITEM(desc, 1));
    Py_buffer b[2];
    int nb = 0, ok = 1;
    int64_t key[6] = { PyLong_AsLong(PyTuple_GET_ITEM(desc, 0)), -1, 0, 0, 0, 0 };
    char *sbuf = NULL, *rbuf = NULL;
    if (c->closed || !parse(args, nargsf, kw, PyTuple_GET_ITEM(desc, 2), a)) return decline(self, args, nargsf, kw);
    for (int i = 0; roles[i] && ok; i++) {
        PyObject *v = a[i];
        switch (roles[i]) {
        case 'x': case 'i': case 'o': {
            int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (roles[i] == 'i' ? 0 : PyBUF_WRITABLE);
            if (!v || PyObject_GetBuffer(v, &b[nb], flags)) { ok = 0; break; }
            nb++;
            if (!plain(&b[nb - 1])) { ok = 0; break; }
            key[3 + (roles[i] == 'o')] = b[nb - 1].len;
            if (nb == 1) key[5] = b[0].itemsize;
            else if (b[nb - 1].itemsize != key[5]) { ok = 0; break; }   /* mixed item sizes: Python checks */
            if (roles[i] != 'o') sbuf = b[nb - 1].buf;
            if (roles[i] != 'i') rbuf = b[nb - 1].buf;
            break;
        }
        case 'r':
            if (!v) break;
            if (!PyLong_CheckExact(v)) { ok = 0; break; }
            key[2] = PyLong_AsLong(v);
            ok = key[2] >= 0 && key[2] < c->size;
            break;
        case 'a':
            if (v && v != Py_None) {
                PyObject *id = PyDict_GetItemWithError(PyTuple_GET_ITEM(self, 3), v);
                if (!id) { ok = 0; break; }
                key[1] = PyLong_AsLong(id);
            }
            break;
        }
    }
    /* two buffers (not Bcast's one) that overlap, the same one included: Python refuses */
    if (ok && nb == 2 && key[3] && key[4] && sbuf < rbuf + key[4] && rbuf < sbuf + key[3]) ok = 0;
    const int64_t *prog = ok ? lookup(c, key) : NULL;
    int rc = prog ? run(c, prog, sbuf, rbuf) : 0;
    for (int i = 0; i < nb; i++) PyBuffer_Release(&b[i]);
    if (!prog) return decline(self, args, nargsf, kw);
    if (!rc) Py_RETURN_NONE;
    PyObject *exc = NULL, *val = NULL, *tb = NULL;
    if (rc == SC_EINTR) PyErr_Fetch(&exc, &val, &tb);
    PyObject *r = PyLong_FromLong(rc), *out = r ? PyObject_CallOneArg(PyTuple_GET_ITEM(self, 2), r) : NULL;
    Py_XDECREF(r);
    if (rc == SC_EINTR && exc) {
        Py_XDECREF(out);
        PyErr_Restore(exc, val, tb);
        return NULL;
    }
    return out;
}

/* exec(context, program, send address, recv address) -> rc */
static PyObject *py_exec(PyObject *mod, PyObject *const *args, Py_ssize_t n)
{
    if (n != 4) {
        PyErr_SetString(PyExc_TypeError, "exec(context, program, sbuf, rbuf)");
        return NULL;
    }
    sc_comm_t *c = PyLong_AsVoidPtr(args[0]);
    const int64_t *prog = PyLong_AsVoidPtr(args[1]);
    char *s = PyLong_AsVoidPtr(args[2]), *r = PyLong_AsVoidPtr(args[3]);
    if (PyErr_Occurred()) return NULL;
    int rc = run(c, prog, s, r);
    if (rc == SC_EINTR && PyErr_Occurred()) return NULL;
    return PyLong_FromLong(rc);
}

static PyMethodDef defs[] = {
    {"collective", (PyCFunction)(void (*)(void))entry, METH_FASTCALL | METH_KEYWORDS, "a collective of one communicator"},
    {"exec", (PyCFunction)(void (*)(void))py_exec, METH_FASTCALL, "exec(context, program, sbuf, rbuf) -> rc"},
};

/* Method definition i, for Python to bind with PyCFunction_NewEx. */
void *sc_py_entry(int i) { return i >= 0 && i < 2 ? &defs[i] : NULL; }
