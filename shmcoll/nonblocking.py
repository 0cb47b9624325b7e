"""Nonblocking (Ibcast, ...) and persistent (Bcast_init, ...) collectives:
a mixin of Comm.  They run the same compiled programs as the blocking
calls, completed through requests (shmcoll/request.py)."""


class Nonblocking:
    """Comm's nonblocking and persistent collective methods."""
