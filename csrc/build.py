"""cffi build of the C core: the collective engine (csrc/*.c but the NUMA shim) is compiled into shmcoll._core.

The cdef is the concatenation of the public headers listed in CDEF_HEADERS;
they hold plain declarations only (no #include, no guards) so that cffi can
parse them and each .c file includes its own header exactly once.  isa.h,
the instruction set, is generated here from shmcoll/isa.py (its one
definition), loaded by path: the package is not built yet.
"""
import importlib.util
import os
import platform
from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
CDEF_HEADERS = ["isa.h", "core.h"]


def write_isa_header():
    """Regenerate csrc/isa.h from the table (rewritten only when it changed)."""
    spec = importlib.util.spec_from_file_location("_shmcoll_isa", os.path.join(HERE, "..", "shmcoll", "isa.py"))
    isa = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(isa)
    path, text = os.path.join(HERE, "isa.h"), isa.header()
    if not os.path.exists(path) or open(path).read() != text:
        with open(path, "w") as f:
            f.write(text)


write_isa_header()
SOURCES = ["core.c", "exec.c", "nbc.c", "twins.c", "copy.c", "reduce.c", "pyfast.c", "pages.c", "peers.c", "p2p.c", "chan.c", "mpiflat.c", "route.c"]

ffibuilder = FFI()
ffibuilder.cdef("\n".join(open(os.path.join(HERE, h)).read() for h in CDEF_HEADERS))
ffibuilder.set_source(
    "shmcoll._core",
    '#include "sc_internal.h"\n',
    sources=[os.path.join("csrc", f) for f in SOURCES],
    include_dirs=[HERE],
    libraries=["pthread"],
    py_limited_api=False,   # pyfast.c uses the full CPython API
    # no contraction into fused multiply-adds: a reduction gives the same bits on every CPU
    extra_compile_args=["-O3", "-std=gnu11", "-ffp-contract=off", "-Wall", "-Wno-unused-function",
                        "-fvisibility=hidden"]
    + (["-march=x86-64-v2"] if platform.machine() in ("x86_64", "AMD64") else []),
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
