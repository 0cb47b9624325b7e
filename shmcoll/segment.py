"""POSIX shared-memory segments.

A segment's name exists only while it is being created: it is unlinked
before any rank runs, and ranks share it through the inherited mapping
(fork) or file descriptor (exec).  So no way of ending a job, kill -9 of the
launcher included, can leave it behind in /dev/shm.  Pages are placed per
NUMA node before they are reserved with posix_fallocate, so a full /dev/shm
is a clear error here rather than SIGBUS in mid-collective.
multiprocessing's resource_tracker is never involved."""
import errno
import mmap
import os
import secrets

import posix_ipc

from . import numa
from .errors import SegmentError

PREFIX = "/shmcoll-"


class Segment:
    def __init__(self, fd, size, mm):
        self.fd, self.size, self.mmap = fd, size, mm

    @classmethod
    def create(cls, size, placement=()):
        """Create, place ((offset, length, node), ...), reserve, unlink."""
        name = PREFIX + secrets.token_hex(12)
        try:
            shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=0)
        except posix_ipc.Error as e:
            raise SegmentError(errno.EIO, f"cannot create shared-memory segment {name}: {e}") from e
        try:
            fd = os.dup(shm.fd)
            shm.close_fd()
            shm.unlink()        # the name lives only between these lines; the fd carries on
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size)
            for offset, length, node in placement:
                if length:
                    numa.bind(mm, node, offset, length, strict=False)
            reserve(fd, size)
            return cls(fd, size, mm)
        except BaseException:
            if "mm" in locals():
                mm.close()
            if "fd" in locals():
                os.close(fd)
            try:
                shm.unlink()
            except posix_ipc.ExistentialError:
                pass
            raise

    @classmethod
    def from_fd(cls, fd, size):
        return cls(fd, size, mmap.mmap(fd, size))

    def close_fd(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def reserve(fd, size):
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        free = _free_bytes()
        raise SegmentError(
            e.errno, f"cannot reserve {size} bytes of shared memory in /dev/shm "
            f"({free} bytes free): {os.strerror(e.errno)}; enlarge /dev/shm or lower "
            f"SHMCOLL_CHAN_BYTES") from None


def _free_bytes():
    try:
        st = os.statvfs("/dev/shm")
        return st.f_bavail * st.f_frsize
    except OSError:
        return "unknown"


def leftovers():
    """Names of shmcoll segments present in /dev/shm (should always be empty)."""
    try:
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith(PREFIX[1:]))
    except FileNotFoundError:
        return []
