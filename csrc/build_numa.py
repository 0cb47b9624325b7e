"""cffi build of the NUMA shim csrc/numa.c into shmcoll._numa.

Separate from the collective core so that placement works (and is testable) on its own. libnuma is
only dlopen'ed at run time, so the build needs neither libnuma-dev nor numaif.h.
Standalone `python3 csrc/build_numa.py` drops shmcoll/_numa*.so into the checkout for development.
"""
import os
from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

ffibuilder = FFI()
ffibuilder.cdef(open(os.path.join(HERE, "numa.h")).read())
ffibuilder.set_source(
    "shmcoll._numa",
    '#include "numa.h"\n',
    sources=["csrc/numa.c"],
    include_dirs=[HERE],
    libraries=["dl", "pthread"],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall"],
)

if __name__ == "__main__":
    os.chdir(ROOT)  # sources are relative to the repo root
    so = ffibuilder.compile(tmpdir=ROOT, verbose=True)
    for junk in ("shmcoll/_numa.c", "shmcoll/_numa.o", "csrc/numa.o"):  # keep the checkout clean
        if os.path.exists(junk):
            os.remove(junk)
    print(so)
