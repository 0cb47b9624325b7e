"""Exceptions.  Every failure names the rank it came from, so a user of a
16-rank job knows where to look."""


class ShmcollError(Exception):
    """Base of shmcoll's own errors."""


class SegmentError(ShmcollError, OSError):
    """A shared-memory segment could not be created or reserved."""


class PeerFailure(ShmcollError):
    """Another rank failed, so this collective cannot complete here."""

    def __init__(self, rank, reason):
        super().__init__(f"rank {rank} {reason}")
        self.rank = rank
        self.reason = reason

    def __reduce__(self):
        return type(self), (self.rank, self.reason)


class PeerDied(PeerFailure):
    """A peer process died (killed, crashed) or exited in mid-collective."""


class PeerAborted(PeerFailure):
    """A peer raised an exception or passed bad arguments and aborted the job."""


class PeerTimeout(PeerFailure):
    """A peer did not arrive within the stall timeout (stopped, stalled, or
    in another call); the job is aborted."""


class MismatchError(ShmcollError, ValueError):
    """Ranks called different collectives, or with different arguments."""


class CMAError(ShmcollError, OSError):
    """A single copy with a peer's memory (process_vm_readv/writev) failed;
    errno says why."""

    def __init__(self, errno, message):
        OSError.__init__(self, errno, message)

    def __str__(self):
        return self.strerror

    def __reduce__(self):
        return type(self), (self.errno, self.strerror)


class WorkerDied(ShmcollError):
    """A pool's worker died (killed, crashed, os._exit) while it ran this
    task; the pool has replaced it."""

    def __init__(self, worker, pid, status):
        import os
        why = f"was killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else \
            f"exited with status {os.waitstatus_to_exitcode(status)}"
        super().__init__(f"pool worker {worker} (pid {pid}) {why} while running this task")
        self.worker, self.pid, self.status, self.why = worker, pid, status, why
        self.signal = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        self.exitcode = None if self.signal else os.waitstatus_to_exitcode(status)

    def __reduce__(self):
        return type(self), (self.worker, self.pid, self.status)


class RemoteTraceback(Exception):
    """Carries a rank's formatted traceback as the cause of a re-raised error."""

    def __str__(self):
        return self.args[0]


# MPI's error classes, MPICH's numbers (MPI.ERR_* and Exception.Get_error_class)
ERR_CLASSES = {"SUCCESS": 0, "ERR_BUFFER": 1, "ERR_COUNT": 2, "ERR_TYPE": 3, "ERR_TAG": 4, "ERR_COMM": 5,
               "ERR_RANK": 6, "ERR_ROOT": 7, "ERR_GROUP": 8, "ERR_OP": 9, "ERR_TOPOLOGY": 10, "ERR_DIMS": 11,
               "ERR_ARG": 12, "ERR_UNKNOWN": 13, "ERR_TRUNCATE": 14, "ERR_OTHER": 15, "ERR_INTERN": 16,
               "ERR_IN_STATUS": 17, "ERR_PENDING": 18, "ERR_REQUEST": 19, "ERR_INFO_KEY": 29,
               "ERR_INFO_VALUE": 30, "ERR_INFO_NOKEY": 31, "ERR_NOT_SUPPORTED": 51}
globals().update(ERR_CLASSES)


class MPIError(ShmcollError):
    """An error with an MPI error class (MPI.Exception): a receive shorter
    than its message (ERR_TRUNCATE), a rank, tag or request out of range."""

    found = None        # a truncated receive's message: (source, tag, bytes), for the status MPI fills

    def __init__(self, error_class, message=""):
        super().__init__(message or _CLASS_NAMES.get(error_class, f"error class {error_class}"))
        self.error_class = error_class

    def Get_error_class(self):
        return self.error_class

    def Get_error_code(self):
        return self.error_class

    def Get_error_string(self):
        return str(self)

    def __reduce__(self):
        return type(self), (self.error_class, str(self))


_CLASS_NAMES = {v: k for k, v in ERR_CLASSES.items()}


class ArgumentError(MPIError, ValueError):
    """A bad argument that has an MPI error class (a root out of range:
    ERR_ROOT), as mpi4py raises it; a ValueError too."""


class Errhandler:
    """What a communicator does with an error found on one rank (MPI's
    error handlers).  ERRORS_ARE_FATAL and ERRORS_ABORT, shmcoll's own
    API's: the job aborts and every rank raises, so no peer waits for a
    rank that gave up.  ERRORS_RETURN, mpi4py's (its COMM_WORLD and
    COMM_SELF have it, new communicators inherit it): a bad argument found
    before the call reached any other rank raises on this rank only and
    the communicator goes on, as MPI's call would return its error; a
    failure after that still aborts (peers may be inside the call)."""

    def __init__(self, name, fatal):
        self._name, self.fatal = name, fatal

    def Free(self):
        pass

    def __bool__(self):
        return self._name != "ERRHANDLER_NULL"

    def __repr__(self):
        return f"<shmcoll.MPI.{self._name}>"


ERRORS_ARE_FATAL, ERRORS_ABORT = Errhandler("ERRORS_ARE_FATAL", True), Errhandler("ERRORS_ABORT", True)
ERRORS_RETURN, ERRHANDLER_NULL = Errhandler("ERRORS_RETURN", False), Errhandler("ERRHANDLER_NULL", True)
