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


class RemoteTraceback(Exception):
    """Carries a rank's formatted traceback as the cause of a re-raised error."""

    def __str__(self):
        return self.args[0]
