"""Point-to-point (Send/Recv and their nonblocking, synchronous, probing
and object forms) on a communicator: a mixin of Comm.  The protocols live
in the device layer (csrc/p2p.c)."""


class PointToPoint:
    """Comm's point-to-point methods."""
