"""Tunable parameters, each with its unit and meaning, and one written-down precedence:
call argument (``options=``) > environment (``SHMCOLL_<NAME>``) > built-in
default (None: derived from the topology by shmcoll.device).  Unknown names
are rejected so a typo never silently does nothing."""
import numbers
import os
import textwrap
from typing import NamedTuple

from .coll.select import TABLE

class Option(NamedTuple):
    default: object     # None: derived from the topology where the job is planned, or unset
    unit: str
    meaning: str


#: Every tunable, the one place its default, unit and meaning are written.
OPTIONS = {
    "chan_bytes": Option(2 << 20, "bytes", "per-rank channel: eager buffer and chunk ring"),
    "chunk_bytes": Option(None, "bytes", "largest ring chunk (default: a quarter of L2); a call's first run plans "
                          "every chunk in Python, so planning time grows with bytes / chunk: a few KiB and up suit "
                          "real runs, tiny chunks are for tests"),
    "inline_bytes": Option(4096, "bytes", "moves of up to this many bytes go in the writer's inline slots, which let "
                           "it run 8 calls ahead of its readers instead of waiting for each to drain the ring (at most "
                           "csrc's SC_INLINE)"),
    "tile_bytes": Option(None, "bytes", "alltoall tile (default: from the shared cache)"),
    "stripe_slots": Option(None, "slots", "numa bcast: striped segments (default: >= 8 and 2 x groups, a multiple "
                           "of nodes)"),
    "bcast_k": Option(None, "ranks", "limited bcast: readers per segment (default: ranks per socket, <= 4)"),
    "nt_bytes": Option(None, "bytes", "calls touching more (all ranks' buffers) stream past the cache (default: "
                       "shared cache size, and for alltoall left to it, also twice the L2s of the ranks' cores)"),
    "check": Option(0, "0/1", "cross-rank argument agreement on every call"),
    "cma_bytes": Option(None, "bytes", "single copy (rendezvous) from here when ranks may read each other; 0: never "
                        "(default: 32 KiB for 2 ranks, 1 MiB for more: below, staging is cheaper than the rendezvous "
                        "and page pinning a single copy costs); blocks with one reader each (gather, scatter, "
                        "alltoall) count together when each rank has a CPU, and by default Alltoall blocks go single "
                        "copy from 8 KiB there (coll/alltoall.py)"),
    "spin_ns": Option(None, "ns", "spin before yielding (default: 50 us, 0 when oversubscribed, except all_to_all "
                      "barrier waits on ranks of other CPUs, which keep 50 us)"),
    "yield_ns": Option(2_000_000, "ns", "yield before sleeping on the futex"),
    "sleep_ns": Option(20_000_000, "ns", "futex timeout: health is re-checked this often while asleep"),
    "liveness_ns": Option(50_000_000, "ns", "how often a waiting rank checks that its peers live"),
    "adapt": Option(None, "bytes", "from this many bytes (bcast: the buffer, alltoall: a block, reductions: the "
                    "input), time the automatic choice by single copy against it staged and run the faster, as rank 0 "
                    "decides per call (csrc/exec.c, twins); 0: never (default: 32 KiB, 0 when cma_bytes is set)"),
    "timeout": Option(1800, "s", "seconds a rank may wait on one peer before the job is aborted (0: never)"),
    "call_base": Option(0, "calls", "every communicator's first call number (tests run it next to 2^31, 2^64)"),
    "record_traffic": Option(0, "0/1", "count the bytes each rank reads from each other (Comm.traffic)"),
    "huge_bytes": Option(2 << 20, "bytes", "a rank's numpy arrays of this many bytes and more start on a 2 MiB "
                         "boundary, their whole 2 MiB ranges on transparent huge pages (the rest on small ones), so a "
                         "single copy pins one page per 2 MiB, not 512; freed ones are kept for reuse, 64 MiB at "
                         "most, as malloc keeps its heap (csrc/pages.c); 0: never"),
    "huge_slot_bytes": Option(64 << 10, "bytes", "and from this many bytes (a power of two) up, in slots of one power "
                              "of two sharing 2 MiB huge pages (128 MiB of them at most, then numpy's): a 256 KiB "
                              "block pins one page, not 64, for up to 2x the memory; 0: never"),
    "shm_bytes": Option(None, "bytes", "space the segment must fit in (default: what /dev/shm has free)"),
    "reduce_small_bytes": Option(None, "bytes", "allreduce: all_at_once while (ranks - 1) x bytes is at most "
                                 "this (an eighth of it when ranks share CPUs); reduce: flat (default: 256 KiB; "
                                 "for 2 ranks with a CPU each, a quarter of the shared cache if more: both "
                                 "algorithms then move the same bytes, and one hand-off wins while the four "
                                 "buffers stay in cache)"),
    "reduce_block_bytes": Option(None, "bytes", "reduce_scatter_allgather: blocks of this many bytes, folded and "
                                 "gathered while in cache (default: an eighth of the shared cache over the ranks, "
                                 "2 MiB at least, as each block costs the ranks one more sync)"),
    "p2p_ring_bytes": Option(None, "bytes", "point-to-point: each ordered pair's ring (default: 1 MiB up to 4 ranks, "
                             "then shrinking so the n^2 rings stay near 16 MiB, 4 KiB at least; docs/p2p.md)"),
    "p2p_eager_bytes": Option(None, "bytes", "messages up to this go inline through the ring, the sender never "
                              "waiting for a receive; larger ones by rendezvous, one copy from the sender's buffer "
                              "(default: min(ring / 4, 16 KiB))"),
    "p2p_queue_bytes": Option(64 << 20, "bytes", "unexpected messages a receiver keeps; beyond, it leaves them in "
                              "their rings and their senders wait"),
    "tuning_file": Option(None, "path", "what `shmcoll tune` measured: the automatic choice's algorithm per "
                          "collective, ranks and bytes (default: $XDG_CACHE_HOME/shmcoll/tuning.json; none: no file)"),
    "model_params": Option(None, "path", "a machine's model parameters (`shmcoll model --measure --params FILE`): "
                           "where no tuning file range applies, the automatic choice takes the model's fastest "
                           "(default: the model is not asked)"),
}
# every collective's algorithm, forced by name (select.forced): one row per TABLE row
OPTIONS.update({f"{op}_algorithm": Option(None, "name", f"{op}'s algorithm, forced (unset or auto: the automatic "
                                          "choice)") for op in TABLE})
DEFAULTS = {name: option.default for name, option in OPTIONS.items()}
#: options whose value is text (a name or a path), taken as given
TEXT = {name for name in DEFAULTS if name.endswith("algorithm")} | {"tuning_file", "model_params"}


def resolve(options=None, environ=os.environ):
    """Return {name: (value, source)} for every parameter."""
    options = dict(options or {})
    unknown = set(options) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown shmcoll option(s): {', '.join(sorted(unknown))}")
    out = {}
    for name, default in DEFAULTS.items():
        env = environ.get("SHMCOLL_" + name.upper())
        if name in options and options[name] is not None:
            out[name] = (_given(name, options[name]), "argument")
        elif env not in (None, ""):
            out[name] = (env if name in TEXT else _int(name, env), "environment")
        else:
            out[name] = (default, "default")
    return out


FLAGS = ("check", "record_traffic")


def _given(name, value):
    """An option given as an argument: an algorithm name as it is, a
    number checked as the environment's text is (True is no byte count)."""
    if name in TEXT:
        return value
    if isinstance(value, str):
        return _int(name, value, f"option {name}")
    if isinstance(value, bool) and name not in FLAGS:
        raise ValueError(f"option {name}={value!r} is not a number")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and (name == "timeout" or float(value).is_integer()):
        return float(value) if name == "timeout" else int(value)
    raise ValueError(f"option {name}={value!r} is not " + ("a number of seconds" if name == "timeout" else "an integer"))


def _int(name, text, label=None):
    label = label or "SHMCOLL_" + name.upper()
    if name == "timeout":
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{label}={text!r} is not a number of seconds") from None
    try:
        return int(text, 0)
    except ValueError:
        pass
    try:
        value = float(text)          # 1e6 and the like
        if value.is_integer():
            return int(value)
    except ValueError:
        pass
    raise ValueError(f"{label}={text!r} is not an integer")


def rows(resolved):
    """{name: its value, unit, default, source, meaning and variable}: what `shmcoll options --json` prints."""
    return {name: {"value": value, "unit": OPTIONS[name].unit, "default": OPTIONS[name].default, "source": source,
                   "meaning": OPTIONS[name].meaning, "env": "SHMCOLL_" + name.upper()}
            for name, (value, source) in resolved.items()}


def shown(name, value, width=None):
    """A value as the table shows it: None as derived (a number) or unset (text); text longer than
    width keeps its end (a path's file name)."""
    text = ("unset" if name in TEXT else "derived") if value is None else str(value)
    return text if not width or len(text) <= width else "..." + text[3 - width:]


#: The most a value takes on a terminal (a long path keeps its end), and the least the meaning column
#: may have before it goes on lines of its own.
VALUE_WIDTH, MEANING_WIDTH = 16, 30


def describe(resolved, width=None):
    """Aligned columns: name, value, unit, default, source, meaning; each option on one line, for grep,
    or, given a terminal's width, its meaning wrapped beside the columns (under them when too narrow)."""
    header = ["name", "value", "unit", "default", "source"]
    cells = [[name, shown(name, value, width and VALUE_WIDTH), OPTIONS[name].unit,
              shown(name, OPTIONS[name].default), source, OPTIONS[name].meaning]
             for name, (value, source) in resolved.items()]
    widths = [max(len(row[i]) for row in [header] + cells) for i in range(len(header))]
    indent = sum(widths) + 2 * len(widths)
    room = width - indent if width else None
    under = room is not None and room < MEANING_WIDTH
    out = []
    for row in [header + ["meaning"]] + cells:
        head = "".join(c.ljust(w + 2) for c, w in zip(row, widths))
        if room is None:
            out.append(head + row[-1])
            continue
        parts = textwrap.wrap(row[-1], width - 4 if under else room) or [""]
        out += ([head.rstrip()] + ["    " + p for p in parts] if under else
                [head + parts[0]] + [" " * indent + p for p in parts[1:]])
    return "\n".join(out)
