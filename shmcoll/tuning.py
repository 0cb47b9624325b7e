"""The tuning file: what `shmcoll tune` measured on this node, as per
collective and rank count a list of byte ranges [lo, hi), each naming the
algorithm that was fastest there (and its parameters, such as `limited`
Bcast's k), or "auto" where the built-in rules were as fast.

It is read once, where the job's plan is made (device.make_plan, in the
launcher), and travels in the plan, so every rank and every communicator
made from the world selects from the same table even if the file changes
mid-job.  A file that cannot be used (unreadable, corrupt, written on
another machine or by another shmcoll) is reported once per process,
with the reason, and the automatic choice goes on without it."""
import json
import math
import os
import sys

FORMAT = 1
OFF = ("none", "off")           # SHMCOLL_TUNING_FILE=none: no tuning file
AUTO = "auto"                   # a range where the built-in rules measured as fast as the best
#: The algorithms whose plan parameters a range may set, and the parameter
#: (an option name: device.make_plan bounds it the same way).
PARAMS = {("bcast", "limited"): "bcast_k", ("bcast", "numa"): "bcast_k", ("alltoall", "tiled"): "tile_bytes"}
_reported = set()
_cache = {}


def default_path(environ=os.environ):
    """$XDG_CACHE_HOME/shmcoll/tuning.json, else ~/.cache/shmcoll/tuning.json."""
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "shmcoll", "tuning.json")


def fingerprint():
    """What a table measured here depends on: the CPU, how many CPUs this
    process may use, the real topology and shmcoll's version."""
    from . import __version__
    from .model.machine import _cpu_model
    from .topology import _cached
    t = _cached(None, "/sys")       # the real machine's, whatever SHMCOLL_TOPOLOGY says
    return {"cpu": _cpu_model(), "cpus": len(os.sched_getaffinity(0)),
            "topology": f"{t.nsockets}x{t.ncores // max(t.nsockets, 1)}x{len(t.nodes)}, {t.ncpus} cpus, "
                        f"L2 {t.cache_size(2)}, shared cache {t.shared_cache_size()}",
            "shmcoll": __version__}


class Tuning:
    """A loaded tuning file (or its absence): path, status (absent,
    loaded, ignored, off), reason, and the choices by (op, nranks)."""

    def __init__(self, path, status, reason="", choices=None):
        self.path, self.status, self.reason = path, status, reason
        self.choices = choices or {}

    def __repr__(self):
        return f"<Tuning {self.path} {self.describe()}>"

    def describe(self):
        """One line for `shmcoll options` and selected()'s reasons."""
        if self.status == "loaded":
            tables = sum(len(t) for t in self.choices.values())
            return f"loaded: {tables} tables ({', '.join(sorted(self.choices))})"
        return self.status + (f": {self.reason}" if self.reason else "")

    def lookup(self, op, nranks, nbytes):
        """(range, why): the file's range holding nbytes for op on nranks
        ranks (None: the file says nothing there), and why, in words."""
        if self.status != "loaded":
            return None, f"tuning file {self.path} {self.describe()}"
        table = self.choices.get(op, {}).get(nranks)
        if table is None:
            return None, f"tuning file {self.path} has no {op} table for {nranks} ranks"
        for r in table:
            if r["lo"] <= nbytes < r["hi"]:
                return r, f"tuning file {self.path}: {op}, {nranks} ranks, {_span(r)} measured {_named(r)} fastest"
        return None, f"tuning file {self.path}: {op}, {nranks} ranks, {nbytes} B is beyond the sizes measured"


def _span(r):
    return f"[{r['lo']}, {r['hi']}) B"


def _named(r):
    params = ", ".join(f"{k}={v}" for k, v in sorted(r.get("params", {}).items()))
    name = "the built-in rules" if r["algorithm"] == AUTO else r["algorithm"]
    return name + (f" ({params})" if params else "")


def load(path=None, environ=os.environ, virtual=False):
    """The Tuning of path (None: SHMCOLL_TUNING_FILE's default place);
    a problem with the file is reported once on stderr and the file
    ignored.  virtual: the job runs on a virtual topology, where tables
    measured on the real one do not apply."""
    if path is not None and str(path).lower() in OFF:
        return Tuning(str(path), "off", "SHMCOLL_TUNING_FILE=none")
    named = path is not None
    path = os.path.abspath(os.path.expanduser(str(path))) if named else default_path(environ)
    if virtual:
        return Tuning(path, "off", "a virtual topology (tables are measured on the real one)")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return _ignored(path, "absent" if not named else "ignored", "no such file", report=named)
    except OSError as e:
        return _ignored(path, "ignored", f"unreadable ({e.strerror})")
    key = (path, st.st_mtime_ns, st.st_size, st.st_ino)
    if key not in _cache:
        _cache.clear()
        _cache[key] = _read(path)
    return _cache[key]


def _ignored(path, status, reason, report=True):
    if report:
        _report(f"tuning file {path}", reason)
    return Tuning(path, status, reason)


def _report(what, reason):
    """One line on stderr, once per process for each file and reason."""
    if (what, reason) not in _reported:
        _reported.add((what, reason))
        print(f"shmcoll: {what} ignored: {reason}", file=sys.stderr)


def model(path):
    """The model.Machine of path, when these are this machine's
    parameters; else None (not asked for, or reported once and ignored)."""
    if not path or str(path).lower() in OFF:
        return None
    from .model import machine
    what = f"model parameters {path}"
    try:
        mc = machine.load(os.path.expanduser(str(path)))
    except OSError as e:
        return _report(what, f"unreadable ({e.strerror or e})")
    except (ValueError, TypeError, KeyError) as e:
        return _report(what, f"corrupt ({e})")
    if not mc.here():
        return _report(what, f"measured on another machine ({mc.description.get('fingerprint')!r})")
    return mc


def _read(path):
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        return _ignored(path, "ignored", f"unreadable ({e.strerror or e})")
    except (ValueError, UnicodeDecodeError) as e:
        return _ignored(path, "ignored", f"corrupt (not JSON: {e})")
    try:
        stale = _stale(doc)
        if stale:
            return _ignored(path, "ignored", f"stale ({stale}); run `shmcoll tune` again")
        return Tuning(path, "loaded", "", _choices(doc["choices"]))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        return _ignored(path, "ignored", f"corrupt ({e})")


def _stale(doc):
    """Why a well-formed file does not describe this machine and version ('' if it does)."""
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    if doc.get("format") != FORMAT:
        return f"format {doc.get('format')!r}, this shmcoll reads {FORMAT}"
    mine, theirs = fingerprint(), doc.get("machine")
    if not isinstance(theirs, dict):
        raise ValueError("no machine")
    for k in mine:
        if theirs.get(k) != mine[k]:
            return f"{k} {theirs.get(k)!r}, here {mine[k]!r}"
    return ""


def _choices(doc):
    """{op: {nranks: [range, ...]}} checked: known names, ranges in order."""
    from .coll import select
    out = {}
    for op, by_n in doc.items():
        if op not in select.TABLE:
            raise ValueError(f"unknown collective {op!r}")
        for n, ranges in by_n.items():
            if int(n) < 1 or not ranges:
                raise ValueError(f"{op}: bad table for {n!r} ranks")
            out.setdefault(op, {})[int(n)] = [_range(op, r) for r in ranges]
            lows = [r["lo"] for r in out[op][int(n)]]
            if any(r["lo"] >= r["hi"] for r in out[op][int(n)]) or lows != sorted(lows):
                raise ValueError(f"{op}, {n} ranks: ranges out of order")
    return out


def _range(op, r):
    from .coll import select
    name, params = r["algorithm"], dict(r.get("params") or {})
    if name != AUTO:
        select.check_name(op, name)
    allowed = PARAMS.get((op, name))
    for k, v in params.items():
        if k != allowed or isinstance(v, bool) or not isinstance(v, int) or not 1 <= v < 1 << 40:
            raise ValueError(f"{op} {name}: bad parameter {k}={v!r}")
    lo, hi = int(r["lo"]), (math.inf if r["hi"] is None else int(r["hi"]))
    return {"lo": lo, "hi": hi, "algorithm": name, "params": params}


def ranges(points):
    """[(bytes, choice), ...] measured (choice: (algorithm, params)) as
    ranges [lo, hi): a boundary at the geometric midpoint of two measured
    sizes, the first from 0, the last half a step past the largest size
    (the next step, as the grid's, unmeasured, falls to the rules),
    neighbours of the same choice merged."""
    points = sorted(points)
    out = []
    for i, (size, (name, params)) in enumerate(points):
        lo = 0 if i == 0 else out[-1]["hi"]
        if i + 1 < len(points):
            hi = _mid(size, points[i + 1][0])
        else:
            prev = points[i - 1][0] if i else size / 2
            hi = max(_mid(size, size * size / max(prev, 1)), size + 1)
        if out and (out[-1]["algorithm"], out[-1]["params"]) == (name, params):
            out[-1]["hi"] = hi
        else:
            out.append({"lo": lo, "hi": hi, "algorithm": name, "params": dict(params)})
    return out


def _mid(a, b):
    return max(int(round(math.sqrt(max(a, 1) * max(b, 1)))), a + 1)


def write(path, choices, measured, settings):
    """Write the file atomically (a job starting meanwhile reads the old
    one or the new, never half of one)."""
    doc = {"format": FORMAT, "machine": fingerprint(), "settings": settings,
           "choices": {op: {str(n): t for n, t in sorted(by_n.items())} for op, by_n in choices.items()},
           "measured": measured}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
