#!/usr/bin/env bash
# Run the NUMA/topology tests under a real 2-socket, 2-node Linux kernel (throwaway QEMU VM sharing
# this host's userland; see ../shared/numa-vm/README.md). Call from CI after `pip install -e .`.
# Exit status: pytest's inside the VM (124 VM timeout, 125 VM/boot failure).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHARED=${SHMCOLL_SHARED:-$ROOT/../shared}
VM=$SHARED/numa-vm/run-in-numa-vm.sh
CACHE=${NUMA_VM_CACHE:-/tmp/numa-vm-cache}
SUDO=; [[ $(id -u) -eq 0 ]] || SUDO=sudo

if ! command -v qemu-system-x86_64 >/dev/null; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends qemu-system-x86 >/dev/null
fi
ls -d "$CACHE"/kernel/lib/modules/*/ >/dev/null 2>&1 || $SUDO env NUMA_VM_CACHE="$CACHE" "$VM" --setup

# The real interpreter, not a pyenv shim: each shim start costs ~4 s under TCG.
PY=$(python3 -c 'import sys; print(sys.executable)')
cd "$ROOT"
tests=(tests/test_numa.py)
[[ -f tests/test_topology.py ]] && tests+=(tests/test_topology.py)
# One retry when the VM itself failed (124 timed out, 125 did not boot: seen
# once here, stuck after "Booting from ROM"); a test failure is never retried.
for attempt in 1 2; do
  rc=0
  "$VM" --sockets 2 --cores 1 --nodes 2 --timeout "${NUMA_VM_TIMEOUT:-300}" -- \
    "$PY" -m pytest -p no:cacheprovider -q -rs "${tests[@]}" || rc=$?
  [[ $rc -eq 124 || $rc -eq 125 ]] || exit $rc
  echo "numa_vm.sh: the VM failed (status $rc); trying once more" >&2
done
exit $rc
