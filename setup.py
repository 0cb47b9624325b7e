from setuptools import setup

# The C core is compiled by cffi at install time (csrc/build.py: the collective engine; csrc/build_numa.py: the NUMA shim).
setup(cffi_modules=["csrc/build.py:ffibuilder", "csrc/build_numa.py:ffibuilder"])
