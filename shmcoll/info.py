"""MPI.Info: string keys to string values, with mpi4py's interface (its
calls and the mapping protocol).  shmcoll reads no hints: an Info given to
Dup or Set_info is checked and not kept, and Get_info hands back an empty
one, as MPI hands back only the hints it uses."""
import os

from .errors import ERR_INFO_KEY, ERR_INFO_NOKEY, ERR_INFO_VALUE, MPIError

MAX_INFO_KEY, MAX_INFO_VAL = 255, 1024      # MPICH's


class Info:
    def __init__(self, info=None):
        self._d = {} if info is None or not info else dict(info._d)
        self._null = False

    @classmethod
    def Create(cls, items=None):
        info = cls()
        if items is not None:
            info.update(items)
        return info

    @classmethod
    def Create_env(cls, args=None):
        """MPI_INFO_ENV's keys that a launched process knows."""
        import sys
        info = cls()
        info._d.update(command=sys.executable, argv=" ".join(sys.argv[1:] if args is None else args),
                       wdir=os.getcwd(), host=os.uname().nodename)
        return info

    def _usable(self, what):
        if self._null:
            raise MPIError(ERR_INFO_KEY, f"Info.{what}: INFO_NULL holds no keys")

    def Free(self):
        self._usable("Free")
        self._d.clear()

    def Dup(self):
        self._usable("Dup")
        return Info(self)

    def Get(self, key):
        """The value, or None when the key is not set."""
        return self._d.get(_key(key))

    def Set(self, key, value):
        self._usable("Set")
        if not isinstance(value, str) or len(value) > MAX_INFO_VAL:
            raise MPIError(ERR_INFO_VALUE, f"Info.Set: value must be a str of at most {MAX_INFO_VAL} characters")
        self._d[_key(key)] = value

    def Delete(self, key):
        self._usable("Delete")
        if self._d.pop(_key(key), None) is None:
            raise MPIError(ERR_INFO_NOKEY, f"Info.Delete: key {key!r} is not set")

    def Get_nkeys(self):
        return len(self._d)

    def Get_nthkey(self, n):
        return list(self._d)[n]

    # -- mpi4py's mapping protocol --------------------------------------------------
    def __len__(self):
        return len(self._d)

    def __contains__(self, key):
        return key in self._d

    def __iter__(self):
        return iter(self._d)

    def __getitem__(self, key):
        return self._d[key]

    def __setitem__(self, key, value):
        self.Set(key, value)

    def __delitem__(self, key):
        if key not in self._d:
            raise KeyError(key)
        self.Delete(key)

    def __bool__(self):
        return not self._null

    def __eq__(self, other):
        return self is other or isinstance(other, Info) and self._null and other._null

    __hash__ = object.__hash__

    def get(self, key, default=None):
        return self._d.get(key, default)

    def keys(self):
        return self._d.keys()

    def values(self):
        return self._d.values()

    def items(self):
        return self._d.items()

    def update(self, other=(), **kw):
        for k, v in dict(other, **kw).items():
            self.Set(k, v)

    def pop(self, key, *default):
        value = self._d.get(key, *default) if default else self._d[key]
        self._d.pop(key, None)
        return value

    def popitem(self):
        return self._d.popitem()

    def copy(self):
        return self.Dup()

    def clear(self):
        self._d.clear()

    def __repr__(self):
        return "<shmcoll.MPI.INFO_NULL>" if self._null else f"<shmcoll.MPI.Info {self._d}>"


def _key(key):
    if not isinstance(key, str) or not 0 < len(key) <= MAX_INFO_KEY:
        raise MPIError(ERR_INFO_KEY, f"Info: key must be a str of 1 to {MAX_INFO_KEY} characters, not {key!r}")
    return key


def _null():
    info = Info()
    info._null = True
    return info


INFO_NULL = _null()
INFO_ENV = Info.Create_env()


def checked(info, what):
    """An Info argument: None, INFO_NULL or an Info (whose hints shmcoll does not read)."""
    if info is not None and not isinstance(info, Info):
        raise TypeError(f"{what}: info must be an MPI.Info, not {type(info).__name__}")
