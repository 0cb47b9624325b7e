/* Python entries of the executor, as CPython builtins (a cffi call would
 * release and retake the GIL on every call):
 *  - entry(): one per collective method of a Comm (Barrier, Bcast, ...),
 *    generic over collectives: it parses the arguments by a role string,
 *    looks the compiled program up in the communicator's cache and runs it,
 *    so a common call costs one C call and no Python frame; the common
 *    buffer specs ([buf, count, MPI.DOUBLE], ...) are cut to their slice
 *    here.  Anything else (a miss, an unusual spec, a read-only buffer, a
 *    bad argument) goes to the Python method, which checks, plans, fills
 *    the cache and runs exec().
 *  - exec(): run a given program on given buffer addresses.
 *  - Start and Wait of a persistent collective (below).
 * Both release the GIL once a wait has lasted a while (arm) or is about to
 * sleep, and then poll for signals, so Ctrl-C interrupts a waiting rank. */
#include <Python.h>
#include "sc_internal.h"

/* Words multiplied by distinct odd constants and summed: independent
 * multiplies, not a chain of SC_KEY dependent ones on every call. */
static uint64_t hash_key(const int64_t *k)
{
    static const uint64_t m[SC_KEY] = { 0x9e3779b97f4a7c15ULL, 0xbf58476d1ce4e5b9ULL, 0x94d049bb133111ebULL,
                                        0xd6e8feb86659fd93ULL, 0xa0761d6478bd642fULL, 0xe7037ed1a0b428dbULL,
                                        0x8ebc6af09c88c6e3ULL };
    uint64_t h = 0;
    for (int i = 0; i < SC_KEY; i++) h += ((uint64_t)k[i] ^ (uint64_t)k[i] >> 29) * m[i];
    return h ^ (h >> 31);
}
/* The cache is SC_WAYS-way set associative: a key may sit in any entry
 * of its set, so a few call shapes whose keys share a set (dtype hashes
 * differ from process to process) all stay in C. */
int sc_cache_slot(const int64_t *key) { return (int)(hash_key(key) % (SC_CACHE / SC_WAYS)) * SC_WAYS; }

static int same_key(const int64_t *a, const int64_t *b)
{
    int64_t d = 0;
    for (int i = 0; i < SC_KEY; i++) d |= a[i] ^ b[i];
    return !d;
}

/* The entry of key's set that holds key, or NULL. */
static sc_entry_t *held(sc_comm_t *c, const int64_t *key)
{
    sc_entry_t *set = &c->cache[sc_cache_slot(key)];
    for (int w = 0; w < SC_WAYS; w++)
        if (set[w].prog && same_key(set[w].key, key)) return &set[w];
    return NULL;
}

/* Install prog for key: in the entry that holds key, else an empty one of
 * its set, else the next in turn (round robin over the set's entries). */
void sc_cache_put(sc_comm_t *c, const int64_t *key, const int64_t *prog)
{
    sc_entry_t *set = &c->cache[sc_cache_slot(key)], *e = held(c, key);
    for (int w = 0; w < SC_WAYS && !e; w++)
        if (!set[w].prog) e = &set[w];
    if (!e) e = &set[c->cache_turn++ % SC_WAYS];
    if (c->last == e) c->last = NULL;
    memcpy(e->key, key, sizeof e->key);
    e->prog = prog;
}

/* A loop of one collective finds its entry again without hashing (the
 * key is compared all the same: Python may have refilled the entry). */
static const int64_t *lookup(sc_comm_t *c, const int64_t *key)
{
    sc_entry_t *e = c->last;
    if (!e || !e->prog || !same_key(e->key, key)) {
        if (!(e = held(c, key))) return NULL;
        c->last = e;
    }
    return e->prog;
}

/* For point-to-point's routed calls (p2p.c): the program cached for key, or NULL. */
const int64_t *sc_cache_get(sc_comm_t *c, const int64_t *key) { return lookup(c, key); }

/* Called by the slow wait every POLL_NS (10 ms) with the GIL released: run Python's
 * signal handlers; nonzero when one raised (the exception stays set). */
static int poll_signals(sc_comm_t *c)
{
    if (!c->hooks.saved) return 0;
    /* A handler may call into shmcoll on this thread's context: it must
     * find the GIL held (no saved state to restore) and may leave the
     * hooks cleared, so the wait's own are kept aside meanwhile. */
    sc_hooks_t mine = c->hooks;
    PyEval_RestoreThread(mine.saved);
    c->hooks.saved = NULL;
    int raised = PyErr_CheckSignals() < 0;
    c->hooks = mine;
    c->hooks.saved = PyEval_SaveThread();
    return raised;
}

static void *release_gil(void) { return PyEval_SaveThread(); }
/* The same hooks for point-to-point's waits (p2p.c). */
void *sc_py_release(void) { return release_gil(); }
int sc_py_poll(sc_comm_t *c) { return poll_signals(c); }

/* A wait lets the GIL go once it has lasted gil_ns, or before it sleeps.
 * With no other thread in the interpreter, that is after SC_GIL_NS: a
 * short wait, as a small call's mostly are, then pays neither the release
 * nor, on its critical path, the retaking.  With other threads, at once,
 * as they would get the GIL only every switch interval from a loop of
 * calls whose waits are short.  Looking at the threads is not free: done
 * every 64th call. */
static void arm(sc_comm_t *c)
{
    if (!(c->call & 63)) {
        PyThreadState *me = PyThreadState_Get();
        PyThreadState *head = PyInterpreterState_ThreadHead(PyThreadState_GetInterpreter(me));
        c->gil_ns = head == me && !PyThreadState_Next(me) ? SC_GIL_NS : 0;
    }
    c->hooks.release = release_gil;
    c->hooks.poll = poll_signals;
}

/* Take the GIL back if a slow wait let it go: before anything touches a
 * Python object again (PyBuffer_Release included). */
static void resume(sc_comm_t *c)
{
    if (c->hooks.saved) {
        PyEval_RestoreThread(c->hooks.saved);
        c->hooks.saved = NULL;
    }
    c->hooks.release = NULL;
    c->hooks.poll = NULL;
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

/* An entry's self: (info, Python method, error handler, {name: algorithm
 * id}, (argument names, {built-in op: code}, IN_PLACE, SUM)), info the
 * bytes of an sc_info_t (core.h; device.entry fills it), read in place: no
 * conversion of Python ints on every call.  Roles, one per argument: 'x'
 * a buffer read on the root and written elsewhere, 'i' read (or IN_PLACE:
 * the next argument's buffer, keyed -2), 'o' written ('I', 'O': the same,
 * None allowed), 'v' written, a v-variant's spec with counts, 'c' counts
 * per rank (Reduce_scatter's recvcounts, packed), 'r' the
 * root, 'p' a built-in reduction op (absent: SUM; its code goes into the
 * key's first word, << 8), 'a' the algorithm.  typed >= 0 marks a
 * collective whose signature holds the dtype of argument typed: the key's
 * sixth word is then that array's dtype hash (numpy arrays only; anything
 * else goes to Python, which keys it the same way). */
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
        PyObject *name = PyTuple_GET_ITEM(kw, k);
        Py_ssize_t i = 0;
        while (i < max && name != PyTuple_GET_ITEM(names, i)) i++;     /* interned, as ours: by identity */
        if (i == max)
            for (i = 0; i < max && PyUnicode_Compare(name, PyTuple_GET_ITEM(names, i)); i++)
                ;
        if (i == max || out[i]) return 0;
        out[i] = args[n + k];
    }
    return 1;
}

/* Plain data the C entries take as it is: no Python objects, and this
 * machine's byte order (Python refuses a foreign one, as mpi4py does). */
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define FOREIGN ">!"
#else
#define FOREIGN "<"
#endif
static int plain(const Py_buffer *b) { return !b->format || !strpbrk(b->format, "O" FOREIGN); }
int sc_py_plain(const Py_buffer *b) { return plain(b); }

/* numpy arrays without the buffer protocol: building the format string
 * for every call (to refuse object dtypes) cost more than the rest of a
 * small call's argument handling.  The array fields read here are numpy's
 * public ABI (ndarraytypes.h, unchanged from 1.7 to 2.x); a dtype is
 * trusted once a full buffer request showed it holds no objects (the
 * cache keeps a reference, so its address cannot be reused; a full cache
 * replaces its oldest entry).  Typed keys name a dtype by its hash, by
 * value as Python's hash(dtype), so equal dtype objects share programs. */
typedef struct {
    PyObject_HEAD
    char *data;
    int nd;
    Py_ssize_t *dims, *strides;
    PyObject *base, *descr;
    int flags;
} np_array;
#define NP_C_CONTIGUOUS 0x0001
#define NP_WRITEABLE 0x0400
#define NP_WARN_ON_WRITE (1u << 31)
#define NDTYPES 16
static PyTypeObject *ndarray;
static struct { PyObject *descr; Py_ssize_t itemsize; Py_hash_t hash; } dtypes[NDTYPES];
static int next_dtype;

static int known(PyObject *descr)
{
    for (int i = 0; i < NDTYPES && dtypes[i].descr; i++)
        if (dtypes[i].descr == descr) return i;
    return -1;
}

/* After a full request of v succeeded and showed a plain dtype. */
static void learn(PyObject *v, const Py_buffer *b)
{
    if (!ndarray && !strcmp(Py_TYPE(v)->tp_name, "numpy.ndarray")) ndarray = (PyTypeObject *)Py_NewRef(Py_TYPE(v));
    if (Py_TYPE(v) != ndarray) return;
    PyObject *d = ((np_array *)v)->descr;
    Py_hash_t h = PyObject_Hash(d);
    if (known(d) >= 0 || b->itemsize <= 0 || h == -1) {
        PyErr_Clear();
        return;
    }
    int i = next_dtype;
    next_dtype = (next_dtype + 1) % NDTYPES;
    Py_XDECREF(dtypes[i].descr);
    dtypes[i].descr = Py_NewRef(d);
    dtypes[i].itemsize = b->itemsize;
    dtypes[i].hash = h;
}

/* The typed key word of array v (a learned dtype's hash), 0 if none. */
static int64_t dtype_word(PyObject *v)
{
    int i = Py_TYPE(v) == ndarray ? known(((np_array *)v)->descr) : -1;
    return i < 0 ? 0 : (int64_t)dtypes[i].hash;
}

static int quick(PyObject *v, int writable, char **buf, Py_ssize_t *len, Py_ssize_t *itemsize)
{
    if (!v || Py_TYPE(v) != ndarray) return 0;
    np_array *a = (np_array *)v;
    unsigned need = NP_C_CONTIGUOUS | (writable ? NP_WRITEABLE : 0), f = (unsigned)a->flags;
    int d = known(a->descr);
    if ((f & (need | NP_WARN_ON_WRITE)) != need || d < 0) return 0;
    *itemsize = dtypes[d].itemsize;
    Py_ssize_t n = *itemsize;
    for (int i = 0; i < a->nd; i++) n *= a->dims[i];
    *buf = a->data;
    *len = n;
    return 1;
}

/* For point-to-point's entries (p2p.c): parse, and a plain contiguous
 * buffer from numpy's fields (b->obj NULL) or a buffer request (release
 * it); 0 if v is neither (no exception set). */
int sc_py_parse(PyObject *const *args, size_t nargsf, PyObject *kw, PyObject *names, PyObject **out)
{
    return parse(args, nargsf, kw, names, out);
}

static PyObject *simple_spec(PyObject *v, int64_t *count, int64_t *displ, int *tix);

static PyObject *s_base, *s_count, *s_get_size;     /* interned attribute names */

/* The attribute names type_index looks up, interned once: 0 on failure (an exception set). */
static int interned(void)
{
    return s_base || ((s_base = PyUnicode_InternFromString("base")) && (s_count = PyUnicode_InternFromString("count"))
                      && (s_get_size = PyUnicode_InternFromString("Get_size")));
}

/* v's memory: numpy's fields (b->obj NULL), or a buffer request of
 * plain data (release it); 0 if neither (no exception set). */
static int memory(PyObject *v, int writable, Py_buffer *b, Py_ssize_t *isz)
{
    b->obj = NULL;
    if (quick(v, writable, (char **)&b->buf, &b->len, isz)) return 1;
    if (PyObject_GetBuffer(v, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0))) {
        PyErr_Clear();
        b->obj = NULL;
        return 0;
    }
    if (!plain(b)) {
        PyBuffer_Release(b);
        b->obj = NULL;
        return 0;
    }
    learn(v, b);
    *isz = b->itemsize;
    return 1;
}

/* For mpiflat.c: v's memory as memory() takes it, and its dtype if it is
 * a numpy array (else NULL). */
int sc_py_array(PyObject *v, int writable, Py_buffer *b, PyObject **descr)
{
    Py_ssize_t isz;
    if (!v || !memory(v, writable, b, &isz)) return 0;
    *descr = ndarray && Py_TYPE(v) == ndarray ? ((np_array *)v)->descr : NULL;
    return 1;
}

/* v's bytes for point-to-point (p2p.c): a plain buffer, or a simple spec
 * ([buf, count, MPI.BYTE], ...: simple_spec) cut to its items as
 * spec.simple cuts it; 0 when neither (the Python path reads or refuses
 * it).  b->obj set: a buffer to release. */
int sc_py_buffer(PyObject *v, int writable, Py_buffer *b)
{
    Py_ssize_t isz;
    int64_t count = -1, displ = 0;
    int tix = -1;
    b->obj = NULL;
    if (PyList_Check(v) || PyTuple_Check(v)) {
        if (!interned()) {
            PyErr_Clear();
            return 0;
        }
        if (!(v = simple_spec(v, &count, &displ, &tix))) return 0;
    }
    if (!memory(v, writable, b, &isz)) return 0;
    if (count < 0 && displ == 0 && tix < 0) return 1;
    Py_ssize_t unit = tix >= 0 ? dtypes[tix].itemsize : isz, n;
    if (unit <= 0 || displ > b->len / unit) goto refuse;
    n = b->len - (Py_ssize_t)displ * unit;
    if (count < 0 ? n % unit : count > n / unit) goto refuse;
    b->buf = (char *)b->buf + displ * unit;
    b->len = count < 0 ? n : (Py_ssize_t)count * unit;
    return 1;
refuse:
    if (b->obj) PyBuffer_Release(b);
    b->obj = NULL;
    return 0;
}

/* n integers from a buffer of C integers (array.array, a numpy int array): 0 if it is not one, or one is negative. */
static int int_buffer(PyObject *seq, int n, int64_t *out)
{
    Py_buffer b;
    if (PyObject_GetBuffer(seq, &b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)) {
        PyErr_Clear();
        return 0;
    }
    const char *f = b.format ? b.format : "B";
    if (*f == '@' || *f == '=' || (*f == '<' && !strcmp(FOREIGN, ">!"))) f++;
    int sign = f[0] && !f[1] && strchr("bhilq", f[0]), ok = f[0] && !f[1] && (sign || strchr("BHILQ", f[0]))
                                                              && b.ndim == 1 && b.itemsize > 0
                                                              && b.len == (Py_ssize_t)n * b.itemsize;
    for (int i = 0; ok && i < n; i++) {
        const char *at = (const char *)b.buf + (Py_ssize_t)i * b.itemsize;
        int64_t v = 0;
        switch (b.itemsize) {
        case 1: v = sign ? (int64_t)*(const int8_t *)at : (int64_t)*(const uint8_t *)at; break;
        case 2: v = sign ? (int64_t)*(const int16_t *)at : (int64_t)*(const uint16_t *)at; break;
        case 4: v = sign ? (int64_t)*(const int32_t *)at : (int64_t)*(const uint32_t *)at; break;
        case 8: v = *(const int64_t *)at; break;        /* an unsigned one past INT64_MAX reads negative */
        default: ok = 0;
        }
        out[i] = v;
        ok = ok && v >= 0;
    }
    PyBuffer_Release(&b);
    return ok;
}

/* n non-negative integers: a list or tuple of exact ints, or a buffer of C integers. */
static int ints(PyObject *seq, int n, int64_t *out)
{
    if (!PyList_Check(seq) && !PyTuple_Check(seq)) return int_buffer(seq, n, out);
    if (PySequence_Fast_GET_SIZE(seq) != n) return 0;
    PyObject **it = PySequence_Fast_ITEMS(seq);
    for (int i = 0; i < n; i++) {
        if (!PyLong_CheckExact(it[i])) return 0;
        int overflow = 0;
        out[i] = PyLong_AsLongLongAndOverflow(it[i], &overflow);
        if (overflow || out[i] < 0) return 0;
    }
    return 1;
}

/* vec's n displacements (after its n counts): packed, in rank order. */
static void packed(int64_t *vec, int n)
{
    int64_t at = 0;
    for (int i = 0; i < n; at += vec[i++]) vec[n + i] = at;
}

/* The first fields of numpy's PyArray_Descr, the same in numpy 1.x and
 * 2.x (ndarraytypes.h): the scalar type, kind, typecode and byte order. */
typedef struct {
    PyObject_HEAD
    PyTypeObject *typeobj;
    char kind, type, byteorder;
} np_descr;

#define NTYPES 16
static struct { PyObject *type, *descr; } types[NTYPES];     /* MPI datatypes seen to name a dtype */
static int next_type;

/* The dtype a spec's datatype t names, as spec.datatype reads it, as an
 * index into dtypes[] (-1: none learned, or not simple): a dtype object
 * itself; a one-character typecode or a scalar type naming buffer a's
 * own dtype (a numpy array's, native byte order, not structured); an MPI
 * datatype (duck typed: .base, .count, Get_size) of one item of a dtype.
 * The Python path learns the dtypes of the specs it reads. */
static int type_index(PyObject *t, PyObject *a)
{
    int i = known(t);
    if (i >= 0) return i;
    if (PyUnicode_Check(t) || PyType_Check(t)) {
        if (Py_TYPE(a) != ndarray) return -1;
        PyObject *descr = ((np_array *)a)->descr;
        const np_descr *d = (const np_descr *)descr;
        if (d->byteorder != '=' && d->byteorder != '|') return -1;
        int same = PyUnicode_Check(t) ? PyUnicode_GET_LENGTH(t) == 1
                                         && PyUnicode_READ_CHAR(t, 0) == (Py_UCS4)(unsigned char)d->type
                                      : d->kind != 'V' && (PyTypeObject *)t == d->typeobj;
        return same ? known(descr) : -1;
    }
    for (int j = 0; j < NTYPES && types[j].type; j++)
        if (types[j].type == t) return known(types[j].descr);
    PyObject *base = PyObject_GetAttr(t, s_base);
    if (!base) {
        PyErr_Clear();
        return -1;
    }
    i = known(base);
    PyObject *count = i >= 0 ? PyObject_GetAttr(t, s_count) : NULL;
    int ok = count && PyLong_CheckExact(count) && PyLong_AsLong(count) == 1 && PyObject_HasAttr(t, s_get_size);
    PyErr_Clear();
    if (ok) {       /* held, so its address names it while cached; datatypes do not change their items */
        int j = next_type;
        next_type = (next_type + 1) % NTYPES;
        Py_XDECREF(types[j].type);
        Py_XDECREF(types[j].descr);
        types[j].type = Py_NewRef(t), types[j].descr = Py_NewRef(base);
    }
    Py_DECREF(base);
    Py_XDECREF(count);
    return ok ? i : -1;
}

/* A non-negative exact int into *out; 0 if not that. */
static int index_of(PyObject *v, int64_t *out)
{
    int overflow = 0;
    if (!PyLong_CheckExact(v)) return 0;
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    return !overflow && *out >= 0;
}

/* A simple buffer spec in the forms mpi4py programs use ([buf, type],
 * [buf, count], [buf, count, type], [buf, (count, displ)], [buf, (count,
 * displ), type], [buf, count, displ, type]): its buffer, with count (-1:
 * left out) and displ in items of its type, *tix the type's dtype
 * (type_index; -1: none given, the buffer's own).  NULL when not that
 * simple (the Python path, spec.simple, reads or refuses it). */
static PyObject *simple_spec(PyObject *v, int64_t *count, int64_t *displ, int *tix)
{
    Py_ssize_t k = PySequence_Fast_GET_SIZE(v);
    PyObject **it = PySequence_Fast_ITEMS(v), *type = NULL, *a = it[0];
    if (k < 2 || k > 4) return NULL;
    *count = -1, *displ = 0, *tix = -1;
    PyObject *c = it[1];
    if (k == 4) {
        if (!index_of(c, count) || !index_of(it[2], displ)) return NULL;
        type = it[3];
    } else if (PyList_Check(c) || PyTuple_Check(c)) {
        if (PySequence_Fast_GET_SIZE(c) != 2 || !index_of(PySequence_Fast_ITEMS(c)[0], count)
                || !index_of(PySequence_Fast_ITEMS(c)[1], displ)) return NULL;
        type = k == 3 ? it[2] : NULL;
    } else if (PyLong_Check(c)) {
        if (!index_of(c, count)) return NULL;
        type = k == 3 ? it[2] : NULL;
    } else if (k == 2) {
        type = c;
    } else return NULL;
    return !type || (*tix = type_index(type, a)) >= 0 ? a : NULL;
}

/* A v-variant's buffer spec, mpi4py's [buf, counts], [buf, counts,
 * dtype], [buf, (counts, displs)], [buf, (counts, displs), dtype] or
 * [buf, counts, displs, dtype] (dtype: the array's own dtype object or a
 * datatype naming it; counts and displacements: lists or tuples of one
 * int per rank): its array, with counts then displacements (packed when
 * not given) in vec; NULL when not that simple ([buf, counts, displs],
 * which mpi4py refuses, included: Python raises). */
/* tix: NULL, the spec's datatype must be its array's own; else where
 * the datatype's index goes (-1: none given), over any buffer (Alltoallv:
 * its bytes counted in the datatype's items, as mpi4py reads them). */
static PyObject *vspec(PyObject *v, int n, int64_t *vec, int *tix)
{
    if (!PyList_Check(v) && !PyTuple_Check(v)) return NULL;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(v);
    PyObject **it = PySequence_Fast_ITEMS(v);
    if (k < 2 || k > 4) return NULL;
    PyObject *counts = it[1], *displ = k == 4 ? it[2] : NULL;
    if (k < 4 && PyTuple_Check(counts)) {       /* where the counts go, a tuple is (counts, displs), as spec.vector reads it */
        if (PyTuple_GET_SIZE(counts) != 2) return NULL;
        displ = PyTuple_GET_ITEM(counts, 1);
        counts = PyTuple_GET_ITEM(counts, 0);
        if (displ == Py_None || PyLong_Check(displ)) return NULL;     /* None, a stride: Python's (int_buffer refuses a 0-d one) */
    }
    if (!ints(counts, n, vec)) return NULL;
    if (k == 3 && (PyList_Check(it[2]) || PyTuple_Check(it[2]))) return NULL;
    int displs = displ != NULL;
    PyObject *dtype = k == 4 ? it[3] : k == 3 ? it[2] : NULL;
    int own = Py_TYPE(it[0]) == ndarray ? known(((np_array *)it[0])->descr) : -1;
    int t = dtype ? type_index(dtype, it[0]) : -1;
    if (dtype && (t < 0 || (!tix && t != own))) return NULL;     /* without tix: a v-spec of its own dtype */
    if (tix) *tix = t;
    if (displs) {
        if (!ints(displ, n, vec + n)) return NULL;
    } else {
        packed(vec, n);
    }
    return it[0];
}

/* For point-to-point's Alltoallv entry (p2p.c): a v-spec's memory (b:
 * numpy's fields, b->obj NULL, or a buffer request to release), its
 * item size, counts and displacements (vec, in items); 0 if it is not
 * the fast path's (no exception set). */
int sc_py_vbuffer(PyObject *v, int n, int writable, int64_t *vec, Py_buffer *b, Py_ssize_t *isz)
{
    b->obj = NULL;
    int tix = -1;
    PyObject *o = interned() ? vspec(v, n, vec, &tix) : NULL;
    if (!o) {
        PyErr_Clear();
        return 0;
    }
    Py_ssize_t unit = tix >= 0 ? dtypes[tix].itemsize : 0;     /* before memory(): learn may replace the entry */
    if (!memory(o, writable, b, isz)) return 0;
    if (unit) *isz = unit;
    return 1;
}

/* The key word of a v-variant (also device.fingerprint's): its n counts
 * then n displacements hashed (FNV-1a on words, odd: never 0, "none");
 * the program holds them exactly. */
int64_t sc_fingerprint(const int64_t *vec, int n)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (int i = 0; i < 2 * n; i++) h = (h ^ (uint64_t)vec[i]) * 0x100000001b3ULL;
    return (int64_t)(h | 1);
}

static int same_counts(const int64_t *prog, const int64_t *vec, int n)
{
    int64_t at = SC_ARG(prog, SC_H_COUNTS);
    return at > 0 && !memcmp(prog + at, vec, 2 * (size_t)n * sizeof *vec);
}

/* IN_PLACE's block (roles b and q): buf holds `all` bytes, the ranks'
 * blocks of whole items, and this rank, the root, keeps its own in place:
 * the block's bytes into *block and its address into *at; 0 when not that
 * (the Python path checks and raises). */
static int in_block(sc_comm_t *c, int64_t root, char *buf, int64_t all, Py_ssize_t isz, int64_t *block, char **at)
{
    if (root != c->rank || !buf || all < 0 || all % c->size || !isz || (all / c->size) % isz) return 0;
    *block = all / c->size;
    *at = buf + root * *block;
    return 1;
}

/* A nonblocking call resolved to prog: when a start made before holds its
 * template (cfg: (the communicator's {program: template}, Complete);
 * nonblocking.py) and it runs inline (not in the background, no call
 * pending ahead of it, the spare state free), it starts here, on the
 * communicator's spare state, without Python's frames (1.7 us of them
 * against a blocking call's 0.5 at 8 B).  Ended inline: a Complete
 * request, the spare free again.  Otherwise (program, send address, recv
 * address), and a fourth item, the start's rc, when it started on the
 * spare and is pending: Python then takes the spare over. */
static PyObject *start_known(sc_comm_t *c, PyObject *cfg, const int64_t *prog, char *sbuf, char *rbuf)
{
    unsigned long long p = (uintptr_t)prog, s = (uintptr_t)sbuf, r = (uintptr_t)rbuf;
    sc_nbc_t *st = c->nb_spare;
    PyObject *tmpl = NULL;
    if (st && !c->closed) {
        PyObject *key = PyLong_FromUnsignedLongLong(p);
        if (!key) return NULL;
        tmpl = PyDict_GetItemWithError(PyTuple_GET_ITEM(cfg, 0), key);
        Py_DECREF(key);
        if (!tmpl && PyErr_Occurred()) return NULL;
    }
    if (!tmpl || !PyTuple_Check(tmpl) || PyTuple_GET_SIZE(tmpl) < 5 || PyTuple_GET_ITEM(tmpl, 4) != Py_False)
        return Py_BuildValue("(KKK)", p, s, r);
    c->nb_spare = NULL;             /* taken: another thread's start meanwhile goes to Python */
    sc_nb_bind(c, st, (uintptr_t)prog, (uintptr_t)sbuf, (uintptr_t)rbuf, 0);
    int rc;
    Py_BEGIN_ALLOW_THREADS          /* a start may spin a while for its peers: the GIL goes, as cffi's call let it */
    rc = sc_nb_start(c, st);
    Py_END_ALLOW_THREADS
    if (!rc && st->fast) {
        c->nb_spare = st;
        PyTypeObject *t = (PyTypeObject *)PyTuple_GET_ITEM(cfg, 1);
        return t->tp_alloc(t, 0);
    }
    return Py_BuildValue("(KKKi)", p, s, r, rc);
}

static PyObject *entry(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kw)
{
    const sc_info_t *info = (const sc_info_t *)PyBytes_AS_STRING(PyTuple_GET_ITEM(self, 0));
    sc_comm_t *c = info->c;
    PyObject *desc = PyTuple_GET_ITEM(self, 4), *a[MAXARGS];
    const char *roles = info->roles;
    Py_buffer b[2];
    int nb = 0, nbuf = 0, ok = 1;
    Py_ssize_t isz0 = 0;
    int64_t key[SC_KEY] = { [SC_K_COLLECTIVE] = info->coll, [SC_K_ALGORITHM] = SC_KEY_NONE };
    int64_t vec[2 * 1024];      /* a v-spec's counts and displacements (MAX_RANKS) */
    char *sbuf = NULL, *rbuf = NULL;
    int typed = info->typed, reduction = info->reduction, inplace = 0, rootspec = -1, blockin = 0, blockout = 0, qin = 0;
    int64_t sword = 0;
    /* resolve: a nonblocking call's entry (nonblocking.py), which only
     * finds the program and the buffers' addresses; started calls pending
     * (the PENDING bit) do not stop it, as they stop a blocking call */
    int resolve = PyTuple_GET_SIZE(self) > 5;
    if ((resolve ? c->closed & ~SC_CLOSED_PENDING : c->closed) || !parse(args, nargsf, kw, PyTuple_GET_ITEM(desc, 0), a))
        return decline(self, args, nargsf, kw);
    if (!interned()) return NULL;
    for (int i = 0; roles[i]; i++) qin |= roles[i] == 'q' && a[i] == PyTuple_GET_ITEM(desc, 2);
    for (int i = 0; roles[i] && ok; i++) {
        PyObject *v = a[i];
        switch (roles[i]) {
        case 'v':
            if (c->size > 1024 || !v || !(v = vspec(v, c->size, vec, NULL))) { ok = 0; break; }
            key[SC_K_COUNTS] = sc_fingerprint(vec, c->size);
            /* fall through: the spec's array is an output */
        case 'I': case 'O':
            if (!v || v == Py_None) {      /* an absent buffer: keyed apart from an empty one */
                key[roles[i] == 'O' ? SC_K_RECV : SC_K_SEND] = SC_KEY_NONE;
                break;
            }
            /* fall through */
        case 'b':
            if (roles[i] == 'b' && v == PyTuple_GET_ITEM(desc, 2)) {   /* IN_PLACE: this rank's block of the output */
                blockin = 1;
                typed += typed == i;
                break;
            }
            /* fall through */
        case 'i':
            if (roles[i] == 'i' && v == PyTuple_GET_ITEM(desc, 2)) {   /* IN_PLACE: the input is the next argument */
                inplace = 1;
                key[SC_K_SEND] = SC_KEY_INPLACE;
                typed += typed == i;
                break;
            }
            /* fall through */
        case 'q':
            if (roles[i] == 'q' && v == PyTuple_GET_ITEM(desc, 2)) {   /* IN_PLACE: the root's block of the input */
                blockout = 1;
                break;
            }
            /* fall through */
        case 'x': case 'o': {
            /* an input that an IN_PLACE output's block is copied onto must be writable */
            int w = (roles[i] != 'i' && roles[i] != 'I' && roles[i] != 'b') || (roles[i] == 'I' && qin),
                out = roles[i] == 'o' || roles[i] == 'O' || roles[i] == 'v' || roles[i] == 'q';
            char *p;
            Py_ssize_t len, isz;
            int64_t count = -1, displ = 0, blocks = 1;
            int spec = v && (PyList_Check(v) || PyTuple_Check(v)), tix = -1;
            if (spec) {
                /* a spec: IN_PLACE calls go to Python */
                if (inplace || !(v = simple_spec(v, &count, &displ, &tix))) {
                    ok = 0;
                    break;
                }
                if (roles[i] == 'I' || roles[i] == 'O') rootspec = i;
                if (PyLong_AsLong(PyTuple_GET_ITEM(desc, 4)) >> i & 1) blocks = c->size;   /* count per block */
            }
            if (!quick(v, w, &p, &len, &isz)) {
                if (!v || PyObject_GetBuffer(v, &b[nb], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (w ? PyBUF_WRITABLE : 0))) {
                    ok = 0;
                    break;
                }
                if (!plain(&b[nb++])) { ok = 0; break; }
                learn(v, &b[nb - 1]);
                p = b[nb - 1].buf, len = b[nb - 1].len, isz = b[nb - 1].itemsize;
            }
            if (spec) {     /* the spec's items, as spec.simple takes them; anything it refuses goes to it */
                Py_ssize_t unit = tix >= 0 ? dtypes[tix].itemsize : isz;
                if (displ > len / unit) { ok = 0; break; }
                Py_ssize_t at = (Py_ssize_t)displ * unit, n = len - at;
                if (count < 0 ? n % unit || (n / unit) % blocks : count > n / unit / blocks) { ok = 0; break; }
                p += at, len = count < 0 ? n : (Py_ssize_t)count * unit * blocks, isz = unit;
            }
            int64_t word = i == typed || (reduction && nbuf) || (qin && roles[i] == 'I')
                           ? tix >= 0 ? (int64_t)dtypes[tix].hash : dtype_word(v) : 0;
            if (roles[i] == 'I') sword = word;
            if (i == typed && !(key[SC_K_TYPE] = word)) { ok = 0; break; }      /* not an array Python keys alike */
            if (reduction && nbuf && word != key[SC_K_TYPE]) { ok = 0; break; }   /* Python refuses two dtypes */
            key[out ? SC_K_RECV : SC_K_SEND] = len;
            if (!nbuf++) {
                isz0 = isz;
                if (typed < 0) key[SC_K_TYPE] = isz;
            } else if (isz != isz0) { ok = 0; break; }      /* mixed item sizes: Python checks */
            if (!out) sbuf = p;
            if (w) rbuf = p;
            break;
        }
        case 'c':       /* Reduce_scatter's recvcounts (the same on every rank), displacements packed */
            if (c->size > 1024 || !v || !ints(v, c->size, vec)) { ok = 0; break; }
            packed(vec, c->size);
            key[SC_K_COUNTS] = sc_fingerprint(vec, c->size);
            break;
        case 'r':
            if (!v) break;
            if (!PyLong_CheckExact(v)) { ok = 0; break; }
            key[SC_K_ROOT] = PyLong_AsLong(v);
            ok = key[SC_K_ROOT] >= 0 && key[SC_K_ROOT] < c->size;
            break;
        case 'p': {
            PyObject *code = PyDict_GetItemWithError(PyTuple_GET_ITEM(desc, 1), v ? v : PyTuple_GET_ITEM(desc, 3));
            if (!code) { ok = 0; break; }               /* a user op: Python folds it */
            key[SC_K_COLLECTIVE] |= PyLong_AsLong(code) << SC_KEY_OP_SHIFT;
            break;
        }
        case 'a':
            if (v && v != Py_None) {
                PyObject *id = PyDict_GetItemWithError(PyTuple_GET_ITEM(self, 3), v);
                if (!id) { ok = 0; break; }
                key[SC_K_ALGORITHM] = PyLong_AsLong(id);
            }
            break;
        }
    }
    if (ok && rootspec >= 0 && key[SC_K_ROOT] != c->rank) {    /* a spec off the root is not read (spec.root_only) */
        int out = roles[rootspec] == 'O';
        key[out ? SC_K_RECV : SC_K_SEND] = SC_KEY_NONE;
        *(out ? &rbuf : &sbuf) = NULL;
        nbuf--;
    }
    if (inplace) sbuf = rbuf;
    if (ok && blockout) {   /* Scatter's root: its block stays in sendbuf, keyed by sendbuf's dtype as Python's scratch */
        ok = sword && in_block(c, key[SC_K_ROOT], sbuf, key[SC_K_SEND], isz0, &key[SC_K_RECV], &rbuf);
        key[SC_K_TYPE] = sword;
    }
    if (ok && blockin)      /* Gather's root, Allgather: the block stays where it is, as Python's copy keys it */
        ok = in_block(c, strchr(roles, 'r') ? key[SC_K_ROOT] : c->rank, rbuf, key[SC_K_RECV], isz0, &key[SC_K_SEND],
                      &sbuf);
    /* two buffers (not Bcast's one) that overlap, the same one included: Python refuses */
    int64_t slen = key[SC_K_SEND], rlen = key[SC_K_RECV];
    if (ok && nbuf == 2 && slen && rlen && sbuf < rbuf + rlen && rbuf < sbuf + slen) ok = 0;
    const int64_t *prog = ok ? lookup(c, key) : NULL;
    if (prog && key[SC_K_COUNTS] && !same_counts(prog, vec, c->size)) prog = NULL;
    if (resolve) {          /* (program, send address, recv address); IN_PLACE's copied blocks: Python's */
        for (int i = 0; i < nb; i++) PyBuffer_Release(&b[i]);
        if (!prog || inplace || blockin || blockout) return decline(self, args, nargsf, kw);
        return start_known(c, PyTuple_GET_ITEM(self, 5), prog, sbuf, rbuf);
    }
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

/* learn(dtype, itemsize, numpy.ndarray): a dtype Python checked (no
 * objects) that the buffer protocol cannot describe (bfloat16): arrays of
 * it take the fast path too. */
static PyObject *py_learn(PyObject *mod, PyObject *const *args, Py_ssize_t n)
{
    if (n != 3 || !PyLong_Check(args[1]) || !PyType_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "learn(dtype, itemsize, numpy.ndarray)");
        return NULL;
    }
    if (!ndarray) ndarray = (PyTypeObject *)Py_NewRef(args[2]);
    Py_hash_t h = PyObject_Hash(args[0]);
    Py_ssize_t size = PyLong_AsSsize_t(args[1]);
    if (h == -1 || size <= 0) return NULL;
    if (known(args[0]) < 0) {
        int i = next_dtype;
        next_dtype = (next_dtype + 1) % NDTYPES;
        Py_XDECREF(dtypes[i].descr);
        dtypes[i].descr = Py_NewRef(args[0]);
        dtypes[i].itemsize = size;
        dtypes[i].hash = h;
    }
    Py_RETURN_NONE;
}

/* A persistent collective's Start and Wait (shmcoll/nonblocking.py binds
 * them per request; self: (the bytes of {context, its sc_nbc_t}, the
 * Python Start, what Python does after a start that did not end inline,
 * the Python Wait)).  With nothing pending on the communicator, a start
 * runs the program inline; when it ends there (its peers were there),
 * the Wait only marks the request inactive: no Python frame either way.
 * Anything else goes to Python. */
typedef struct { sc_comm_t *c; sc_nbc_t *st; } preq_t;

static PyObject *pstart(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kw)
{
    Py_ssize_t n = PyVectorcall_NARGS(nargsf) + (kw ? PyTuple_GET_SIZE(kw) : 0);
    const preq_t *p = (const preq_t *)PyBytes_AS_STRING(PyTuple_GET_ITEM(self, 0));
    sc_comm_t *c = p->c;
    sc_nbc_t *st = p->st;
    if (n || c->closed || st->active) return PyObject_Vectorcall(PyTuple_GET_ITEM(self, 1), args, nargsf, kw);
    st->active = 1;
    int rc = sc_nb_start(c, st);
    if (!rc && st->fast) Py_RETURN_NONE;
    PyObject *r = PyLong_FromLong(rc), *out = r ? PyObject_CallOneArg(PyTuple_GET_ITEM(self, 2), r) : NULL;
    Py_XDECREF(r);
    return out;
}

static PyObject *pwait(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kw)
{
    Py_ssize_t n = PyVectorcall_NARGS(nargsf) + (kw ? PyTuple_GET_SIZE(kw) : 0);
    sc_nbc_t *st = ((const preq_t *)PyBytes_AS_STRING(PyTuple_GET_ITEM(self, 0)))->st;
    if (!n && st->active && st->fast) {
        st->active = 0;
        Py_RETURN_TRUE;
    }
    return PyObject_Vectorcall(PyTuple_GET_ITEM(self, 3), args, nargsf, kw);
}

PyObject *sc_py_huge_arrays(PyObject *mod, PyObject *const *args, Py_ssize_t n);   /* pages.c */

static PyMethodDef defs[] = {
    {"collective", (PyCFunction)(void (*)(void))entry, METH_FASTCALL | METH_KEYWORDS, "a collective of one communicator"},
    {"exec", (PyCFunction)(void (*)(void))py_exec, METH_FASTCALL, "exec(context, program, sbuf, rbuf) -> rc"},
    {"learn", (PyCFunction)(void (*)(void))py_learn, METH_FASTCALL, "learn(dtype, itemsize, numpy.ndarray)"},
    {"huge_arrays", (PyCFunction)(void (*)(void))sc_py_huge_arrays, METH_FASTCALL,
     "huge_arrays(numpy _ARRAY_API, min_bytes, slot_bytes)"},
    {"Start", (PyCFunction)(void (*)(void))pstart, METH_FASTCALL | METH_KEYWORDS, "start the persistent collective"},
    {"Wait", (PyCFunction)(void (*)(void))pwait, METH_FASTCALL | METH_KEYWORDS, "wait for the persistent collective"},
};

/* Method definition i, for Python to bind with PyCFunction_NewEx. */
void *sc_py_entry(int i) { return i >= 0 && i < (int)(sizeof defs / sizeof defs[0]) ? &defs[i] : NULL; }
