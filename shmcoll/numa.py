"""NUMA placement of shared-memory ranges (thin layer over the cffi shim shmcoll._numa).

shmcoll places each rank's part of a segment on that rank's node: it creates the POSIX shm object
(shm_open + ftruncate), mmaps it, calls bind() on each range *before* any page exists, and only then
reserves the pages (posix_fallocate) and maps the segment in every rank. bind() on a MAP_SHARED
mapping of a tmpfs object sets the object's shared policy, so pages allocated later -- by fallocate
or by first touch through any process's mapping -- land on the chosen node. bind() does not move
pages that already exist.

Ranges are widened to whole pages (start rounded down, end rounded up) because a policy is per page
and every requested byte must be covered; bytes sharing those edge pages get the same policy. Keep
ranges page-aligned (mmap'ed segments are) to avoid surprising neighbours.

Importing is cheap: one small extension module, no sysfs reads until asked.
"""
import mmap as _mmap
import os
from contextlib import contextmanager

from shmcoll._numa import ffi as _ffi, lib as _lib

PAGE = _mmap.PAGESIZE
_BACKENDS = ("none", "syscall", "libnuma")
_MODES = {0: "default", 1: "preferred", 2: "bind", 3: "interleave", 4: "local"}

__all__ = ["backend", "available", "nodes", "num_nodes", "bind", "interleave", "node_of",
           "nodes_of_pages", "policy_of", "PAGE"]


def backend() -> str:
    """'libnuma' (libnuma.so.1 found at run time), 'syscall' (raw syscalls) or 'none' (no kernel
    NUMA support, or the syscalls are blocked, e.g. by a container's seccomp profile)."""
    return _BACKENDS[_lib.sc_numa_backend()]


def available() -> bool:
    """True when the kernel's NUMA policy syscalls work for this process."""
    return _lib.sc_numa_backend() != 0


def _set_backend(name: str) -> None:
    """Force a backend (tests exercise both the libnuma and the raw-syscall paths)."""
    _lib.sc_numa_backend()  # make sure detection ran first, so it does not override us later
    r = _lib.sc_numa_set_backend(_BACKENDS.index(name))
    if r < 0:
        raise OSError(-r, f"NUMA backend {name!r} unavailable: {os.strerror(-r)}")


def _mask_to_list(mask) -> list:
    bits = 8 * _ffi.sizeof("unsigned long")
    return [w * bits + b for w in range(len(mask)) for b in range(bits) if mask[w] >> b & 1]


def nodes() -> list:
    """Ids of the nodes that have memory (sysfs has_memory); [0] on a machine without NUMA.
    Not cached: memory hotplug can change it and the read is cheap."""
    mask = _ffi.new("unsigned long[]", _lib.SC_NUMA_MASK_WORDS)
    _lib.sc_numa_memory_nodes(mask, _lib.SC_NUMA_MASK_WORDS)
    return _mask_to_list(mask) or [0]


def num_nodes() -> int:
    """Number of nodes with memory (>= 1)."""
    return len(nodes())


@contextmanager
def _range(buf, offset, length, need_length=True):
    """Yield (addr, length) of buf[offset:offset+length]; buf is a buffer-protocol object or an int
    address. The cffi view pins the buffer (no resize/close of an mmap) until the call returns."""
    if isinstance(buf, int):
        if length is None and need_length:
            raise TypeError("length is required when buf is an address")
        if offset < 0 or (length or 0) < 0:
            raise ValueError(f"negative offset/length ({offset}, {length})")
        yield buf + offset, length or 0
        return
    with _ffi.from_buffer(buf) as view:
        size = len(view)
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size or (not need_length and offset >= size):
            raise ValueError(f"range offset={offset} length={length} outside buffer of {size} bytes")
        yield int(_ffi.cast("uintptr_t", view)) + offset, length


def _pages(addr, length):
    """Page-aligned (start, length) covering [addr, addr+length)."""
    start = addr & ~(PAGE - 1)
    end = (addr + length + PAGE - 1) & ~(PAGE - 1)
    return start, end - start


def _check(r, what):
    if r < 0:
        raise OSError(-r, f"{what}: {os.strerror(-r)}")
    return r


def _check_node(node):
    ns = nodes()
    if node not in ns:
        raise ValueError(f"NUMA node {node} does not exist or has no memory (nodes with memory: {ns})")
    return ns


def bind(buf, node: int, offset: int = 0, length=None, strict: bool = True) -> None:
    """Place the pages of buf[offset:offset+length] (widened to whole pages) on `node`: MPOL_BIND,
    or MPOL_PREFERRED when strict is False (fall back to other nodes when `node` is full).
    Call before the pages are first allocated. Quiet no-op on one node or without NUMA support."""
    ns = _check_node(node)
    with _range(buf, offset, length) as (addr, n):
        if n == 0 or len(ns) < 2 or not available():
            return
        start, n = _pages(addr, n)
        _check(_lib.sc_numa_bind(_ffi.cast("void *", start), n, node, int(strict)),
               f"mbind({'MPOL_BIND' if strict else 'MPOL_PREFERRED'}, node {node}, {n} bytes)")


def interleave(buf, offset: int = 0, length=None) -> None:
    """Spread the pages of the range round-robin over all nodes with memory (MPOL_INTERLEAVE),
    for data every rank reads equally. Same widening and no-op rules as bind()."""
    with _range(buf, offset, length) as (addr, n):
        if n == 0 or num_nodes() < 2 or not available():
            return
        start, n = _pages(addr, n)
        _check(_lib.sc_numa_interleave(_ffi.cast("void *", start), n), f"mbind(MPOL_INTERLEAVE, {n} bytes)")


def node_of(buf, offset: int = 0) -> int:
    """Node of the page holding buf+offset; faults the page in (reading) if it is not yet mapped,
    so it reports where the page *is*, allocating it per policy if needed. -1 without NUMA support."""
    with _range(buf, offset, None, need_length=False) as (addr, _):
        if not available():
            return -1
        return _check(_lib.sc_numa_node_of(_ffi.cast("void *", addr)), "get_mempolicy(MPOL_F_NODE|MPOL_F_ADDR)")


def nodes_of_pages(buf, offset: int = 0, length=None) -> list:
    """Per-page node of buf[offset:offset+length] (whole pages) from a move_pages query, which does
    not fault anything in: a page not mapped in this process reads -errno (-ENOENT, i.e. -2).
    All -1 without NUMA support."""
    with _range(buf, offset, length) as (addr, n):
        start, n = _pages(addr, n)
        count = n // PAGE
        if not available():
            return [-1] * count
        pages = _ffi.new("void *[]", [_ffi.cast("void *", start + i * PAGE) for i in range(count)])
        status = _ffi.new("int[]", count)
        if count:
            _check(_lib.sc_numa_query_pages(pages, count, status), "move_pages(query)")
        return list(status)


def policy_of(buf, offset: int = 0):
    """(mode, nodes) of the memory policy governing the page at buf+offset, e.g. ('bind', [1]);
    ('default', []) without NUMA support. For shm mappings this is the object's shared policy."""
    with _range(buf, offset, None, need_length=False) as (addr, _):
        if not available():
            return "default", []
        mode = _ffi.new("int *")
        mask = _ffi.new("unsigned long[]", _lib.SC_NUMA_MASK_WORDS)
        _check(_lib.sc_numa_policy_of(_ffi.cast("void *", addr), mode, mask, _lib.SC_NUMA_MASK_WORDS),
               "get_mempolicy(MPOL_F_ADDR)")
        return _MODES.get(mode[0] & 0xFF, str(mode[0])), _mask_to_list(mask)
