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

    name = None         # a named segment's name, until unlink()

    @classmethod
    def create(cls, size, placement=(), name=None):
        """Create, place ((offset, length, node), ...), reserve, unlink;
        with a name (a communicator's fallback, see open_named), the name
        stays until unlink()."""
        keep, name = name is not None, name or PREFIX + secrets.token_hex(12)
        try:
            shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=0)
        except posix_ipc.Error as e:
            raise SegmentError(errno.EIO, f"cannot create shared-memory segment {name}: {e}") from e
        try:
            fd = os.dup(shm.fd)
            shm.close_fd()
            if not keep:
                shm.unlink()        # the name lives only between these lines; the fd carries on
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size)
            for offset, length, node in placement:
                if length:
                    numa.bind(mm, node, offset, length, strict=False)
            reserve(fd, size)
            seg = cls(fd, size, mm)
            seg.name = name if keep else None
            return seg
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

    @classmethod
    def open_proc(cls, pid, fd, size):
        """Map the segment that process pid holds open as fd (its name long
        gone): /proc's link to it needs the ptrace read access the ranks
        already grant each other.  PermissionError where a policy refuses."""
        return cls._open(f"/proc/{pid}/fd/{fd}", size)

    @classmethod
    def open_named(cls, name, size):
        return cls._open("/dev/shm" + name, size)

    @classmethod
    def _open(cls, path, size):
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            if os.fstat(fd).st_size != size:
                raise SegmentError(errno.EINVAL, f"{path} is not a segment of {size} bytes")
            return cls(fd, size, mmap.mmap(fd, size))
        except BaseException:
            os.close(fd)
            raise

    def unlink(self):
        """Remove a named segment's name (every member has it open)."""
        if self.name is not None:
            try:
                os.unlink("/dev/shm" + self.name)
            except FileNotFoundError:
                pass
            self.name = None

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
            f"({free} bytes free): {os.strerror(e.errno)}; enlarge /dev/shm, free communicators, or lower "
            f"SHMCOLL_CHAN_BYTES or SHMCOLL_P2P_RING_BYTES") from None


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


def job_prefix():
    """A job's prefix for names its ranks make after they exist (a
    communicator's named fallback); the launcher sweeps it when the job
    ends, so a rank that dies between creating and unlinking leaks nothing."""
    return PREFIX + "job" + secrets.token_hex(6) + "-"


def sweep(prefix):
    """Unlink every segment whose name begins with prefix (a job's)."""
    if not prefix:
        return
    for name in leftovers():
        if ("/" + name).startswith(prefix):
            try:
                os.unlink("/dev/shm/" + name)
            except FileNotFoundError:
                pass
