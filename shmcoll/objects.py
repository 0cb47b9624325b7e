"""The lower-case methods' path: Python objects, pickled, moved by the
buffer collectives of a Comm (comm), unpickled.  Sizes are unknown up
front, so each call first learns them (or sends them with the data,
collect)."""
import pickle

import numpy as np

from . import buffers, ops

COMBINED = 1024     # bytes a rank deposits when sizes are unknown: size, capacity (24) and up to 1000 of data


def _pickled(obj):
    return np.frombuffer(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL), np.uint8)


def _displs(sizes):
    return tuple(int(d) for d in np.concatenate([[0], np.cumsum(sizes)[:-1]]))


def _unpickled(buf, sizes):
    at = np.concatenate([[0], np.cumsum(sizes)])
    return [pickle.loads(buf[at[i]:at[i + 1]].tobytes()) for i in range(len(sizes))]


def _bytes(a):
    ptr, n, _ = buffers.view(a, "buffer", writable=False)
    return ptr, n


def bcast(comm, obj, root):
    """Pickle on the root; length first (8 B, inline), then the bytes."""
    n = np.zeros(1, np.int64)
    data = None
    if comm.rank == root:
        data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
        n[0] = len(data)
    comm.Bcast(n, root)
    buf = bytearray(data) if comm.rank == root else bytearray(int(n[0]))
    comm.Bcast(buf, root)
    return obj if comm.rank == root else pickle.loads(buf)


def alltoall(comm, objs):
    """objs[i] goes to rank i.  One Alltoall of every rank's size vector
    gives all ranks the same table, hence one block width for the data."""
    p = comm.size
    if len(objs) != p:
        raise ValueError(f"alltoall needs one object per rank ({p}), got {len(objs)}")
    blobs = [pickle.dumps(o, pickle.HIGHEST_PROTOCOL) for o in objs]
    sizes = np.array([len(b) for b in blobs], np.int64)
    table = np.empty((p, p), np.int64)
    comm.Alltoall(np.tile(sizes, (p, 1)), table)
    send = np.zeros((p, int(table.max())), np.uint8)
    for i, b in enumerate(blobs):
        send[i, :len(b)] = np.frombuffer(b, np.uint8)
    recv = np.empty_like(send)
    comm.Alltoall(send, recv)
    return [pickle.loads(recv[i, :table[i, comm.rank]].tobytes()) for i in range(p)]


def collect(comm, data, capacity=-1, item=1):
    """Every rank's bytes (uint8 arrays) in rank order, and their sizes,
    without knowing the sizes up front: paper 003's store-and-forward
    Collect, each rank's size riding with its data in one round; a
    second round of exactly the sizes only when a piece exceeds the
    combined block.  Each rank's receive capacity (bytes, item size;
    -1: any) rides along too, so every rank refuses a too-small one."""
    p = comm.size
    block = np.zeros(COMBINED, np.uint8)
    block[:24].view(np.int64)[:] = (data.size, capacity, item)
    if data.size <= COMBINED - 24:
        block[24:24 + data.size] = data
    got = np.empty((p, COMBINED), np.uint8)
    comm.Allgather(block, got)
    head = got[:, :24].copy().view(np.int64).reshape(p, 3)
    sizes = head[:, 0]
    for r, (_, cap, it) in enumerate(head):
        if cap >= 0 and (sizes.sum() > cap or (sizes % it).any()):
            raise ValueError(f"rank {r}'s recvbuf holds {cap // it} items of {it} bytes but the ranks sent "
                             f"{[int(n) for n in sizes]} bytes")
    if sizes.max() <= COMBINED - 24:
        return sizes, [got[r, 24:24 + sizes[r]] for r in range(p)]
    recv = np.empty(int(sizes.sum()), np.uint8)
    comm.Allgatherv(data, [recv, [int(n) for n in sizes]])
    at = np.concatenate([[0], np.cumsum(sizes)])
    return sizes, [recv[at[r]:at[r + 1]] for r in range(p)]


def allgather(comm, obj):
    """Every rank's object, in rank order: sizes and pickles together, in
    one round when each fits the combined block (collect)."""
    _, pieces = collect(comm, _pickled(obj))
    return [pickle.loads(p.tobytes()) for p in pieces]


def gather(comm, obj, root):
    """Every rank's object on the root (a list), None elsewhere."""
    data = _pickled(obj)
    sizes = np.empty(comm.size, np.int64)
    comm.Allgather(np.array([data.size], np.int64), sizes)
    recv = np.empty(int(sizes.sum()) if comm.rank == root else 0, np.uint8)
    comm._vrun("gatherv", None, root, *_bytes(data), *_bytes(recv), 1, recv.dtype, tuple(sizes), _displs(sizes),
               "sendbuf")
    return _unpickled(recv, sizes) if comm.rank == root else None


def scatter(comm, objs, root):
    """objs[i] (a sequence on the root) goes to rank i."""
    sizes = np.zeros(comm.size, np.int64)
    send = np.zeros(0, np.uint8)
    if comm.rank == root:
        if objs is None or len(objs) != comm.size:
            raise ValueError(f"scatter needs one object per rank ({comm.size}) on the root")
        blobs = [_pickled(o) for o in objs]
        sizes[:] = [b.size for b in blobs]
        send = np.concatenate(blobs)
    comm.Bcast(sizes, root)
    recv = np.empty(int(sizes[comm.rank]), np.uint8)
    comm._vrun("scatterv", None, root, *_bytes(send), *_bytes(recv), 1, recv.dtype, tuple(sizes), _displs(sizes),
               "recvbuf")
    return pickle.loads(recv.tobytes())


def reduction(comm, obj, op, upto, root=None):
    """Ranks 0 .. upto - 1's objects folded by op in rank order: on every
    rank (allreduce, scan, exscan; None where upto is 0), or on the root
    (reduce; None elsewhere)."""
    ops.check_op(op)
    if root is None:
        return fold(allgather(comm, obj), op, upto)
    objs = gather(comm, obj, root)
    return fold(objs, op, upto) if comm.rank == root else None


def fold(objs, op, upto):
    """objs[0] op ... op objs[upto - 1], in rank order (None if upto is 0):
    objects, or a user op's blocks (op: Op.block)."""
    if upto == 0:
        return None
    acc = objs[0]
    for o in objs[1:upto]:
        acc = op(acc, o)
    return acc
