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


class RemoteTraceback(Exception):
    """Carries a rank's formatted traceback as the cause of a re-raised error."""

    def __str__(self):
        return self.args[0]
