"""Communicators made from a communicator (Dup, Split, Create_group, ...)
and Groups: a mixin of Comm.  Each new communicator has its own segment,
flags and programs."""


class Communicators:
    """Comm's methods that make, compare, name and free communicators."""
