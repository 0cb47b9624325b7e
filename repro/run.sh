#!/bin/bash
# run.sh LIB NODES N prog args...   (LIB: mpich|openmpi)
lib=$1; nodes=$2; n=$3; shift 3
cd /work/wt-review
if [ $lib = mpich ]; then
  SHMCOLL_VIRTUAL_NODES=$nodes PYTHONPATH=/work/wt-review timeout ${T:-60} /tmp/mn-mpich/bin/mpiexec -n $n /tmp/mn-mpich/bin/python "$@"
else
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 SHMCOLL_VIRTUAL_NODES=$nodes PYTHONPATH=/work/wt-review timeout ${T:-60} /tmp/mn-openmpi/bin/mpiexec --oversubscribe -x SHMCOLL_VIRTUAL_NODES -x PYTHONPATH -n $n /tmp/mn-openmpi/bin/python "$@"
fi
echo "rc=$?"
