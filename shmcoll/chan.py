"""The pool's messages (shmcoll/pool.py): rings in memory mapped shared
and anonymous before the fork (csrc/chan.c), one each way per worker,
and the owner's bell.  A message is pickled with protocol 5, so a numpy
array's bytes go from its memory into the ring and out of it into the
receiver's array: one copy each side."""
import mmap
import pickle
import struct
import sys

import numpy as np

from ._core import ffi, lib

CHAN = 4 << 20          # bytes of a ring; a larger message streams through it
SPIN_NS = 30_000        # a wait spins this long before it sleeps
SLICE_NS = 200_000_000  # a wait returns this often to see whether its peer lives
LINE = 64
HEAD = struct.Struct("<iiqqq")   # kind, buffers, task id, pickle bytes, body bytes
TASK, RESULT, ERROR, STOP, SHRINK, GROUP = 1, 2, 3, 4, 5, 6
# The worker's state line: the id of the task it runs.
STARTED = struct.Struct("<q")


def pad(n):
    return -n % LINE


class Memory:
    """The pool's shared memory: the owner's bell, then per worker slot a
    state line, the task ring and the result ring."""

    def __init__(self, n):
        self.chan = lib.sc_chan_size(CHAN)
        self.slot = LINE + 2 * (self.chan + pad(self.chan))
        self.map = mmap.mmap(-1, LINE + n * self.slot)
        self.base = int(ffi.cast("uintptr_t", ffi.from_buffer(self.map)))
        self.bell = ffi.cast("char *", self.base)
        self.tasks = [ffi.cast("char *", self.base + self.state(i) + LINE) for i in range(n)]
        self.results = [ffi.cast("char *", self.base + self.state(i) + LINE + self.chan + pad(self.chan))
                        for i in range(n)]

    def state(self, i):
        return LINE + i * self.slot

    def reset(self, i):
        STARTED.pack_into(self.map, self.state(i), -1)
        lib.sc_chan_init(self.tasks[i], CHAN)
        lib.sc_chan_init(self.results[i], CHAN)


def message(kind, tid, obj):
    """A message as a list of buffers: header, pickle, then the arrays'
    bytes out of band, each on a line boundary."""
    bufs = []
    data = pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
    if not bufs:
        return [HEAD.pack(kind, 0, tid, len(data), len(data)) + data]
    raws = [b.raw() for b in bufs]
    table = struct.pack(f"<{len(raws)}q", *(r.nbytes for r in raws))
    body = len(table) + pad(len(table)) + len(data) + pad(len(data)) + sum(r.nbytes + pad(r.nbytes) for r in raws)
    parts = [HEAD.pack(kind, len(raws), tid, len(data), body) + table + bytes(pad(len(table))) + data
             + bytes(pad(len(data)))]
    for r in raws:
        parts += [r, bytes(pad(r.nbytes))] if pad(r.nbytes) else [r]
    return parts


def put(ring, parts, alive):
    """Write a message whole; False if the reader died first (alive())."""
    for part in parts:
        src, n, done = ffi.from_buffer(part), len(part) if isinstance(part, bytes) else part.nbytes, 0
        while done < n:
            done += lib.sc_chan_put(ring, src + done, n - done, SPIN_NS, SLICE_NS)
            if done < n and not alive():
                return False
    return True


def get(ring, dst, n, alive, spin=SPIN_NS):
    done = 0
    while done < n:
        done += lib.sc_chan_get(ring, dst + done, n - done, spin, SLICE_NS)
        if done < n and not alive():
            return False
    return True


REUSE = 1 << 20     # blocks this large are kept, and taken again once nothing refers to them
SPARES = 3          # how many: a loop `y = f(x)` holds the last result while the next arrives
_spares = []        # a fresh 64 MiB block costs page faults (and compaction) worth 2-4 copies


def _block(n):
    """n bytes for a message's arrays: a kept block that fits and that
    nothing refers to any more (its arrays and their views are gone), else
    a new one, kept in place of the oldest."""
    if n < REUSE:
        return np.empty(n, np.uint8)
    for b in _spares:
        if n <= b.size <= 2 * n and sys.getrefcount(b) == 3:     # the list's, the loop's, the call's
            return b
    _spares.append(np.empty(n, np.uint8))
    del _spares[:-SPARES]
    return _spares[-1]


def receive(ring, alive, heard=None, spin=SPIN_NS):
    """(kind, task id, object) of the next message, None if the writer died
    in it; heard(task id) is called once the header is in.  The arrays'
    bytes land in one line-aligned block, which the unpickled arrays then
    own."""
    head = bytearray(HEAD.size)
    if not get(ring, ffi.from_buffer(head), HEAD.size, alive, spin):
        return None
    kind, nbuf, tid, plen, body = HEAD.unpack(head)
    if heard is not None:
        heard(tid)
    if not nbuf:
        data = bytearray(body)
        return (*_loads(kind, tid, data),) if get(ring, ffi.from_buffer(data), body, alive) else None
    block = _block(body + LINE)
    off = -block.ctypes.data % LINE
    view = block[off:off + body]
    if not get(ring, ffi.cast("char *", view.ctypes.data), body, alive):
        return None
    mem = memoryview(view)
    sizes = struct.unpack_from(f"<{nbuf}q", mem)
    at = 8 * nbuf + pad(8 * nbuf)
    data, at = mem[at:at + plen], at + plen + pad(plen)
    bufs = []
    for size in sizes:
        bufs.append(mem[at:at + size])
        at += size + pad(size)
    return _loads(kind, tid, data, bufs)


def _loads(kind, tid, data, bufs=()):
    """(kind, tid, object); a message that does not unpickle here (an
    exception class whose __init__ takes other arguments) becomes its
    task's error, not the reader's."""
    try:
        return kind, tid, pickle.loads(data, buffers=bufs)
    except Exception as e:
        return ERROR, tid, (RuntimeError(f"a task's {'result' if kind == RESULT else 'error'} could not be "
                                         f"unpickled here: {e!r}"), "")
