"""Shared-memory segments: private (0600), never left behind in /dev/shm
(the name is unlinked before any rank runs), and a full /dev/shm is a clear
SegmentError at creation rather than SIGBUS in mid-collective."""
import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import posix_ipc
import pytest

import shmcoll
from shmcoll import segment
from shmcoll.segment import Segment
from conftest import ROOT, run_ranks, shared_array


def open_fds():
    return set(os.listdir("/proc/self/fd"))


def enospc(*a, **k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


# -- reservation failure, injected ------------------------------------------------

@pytest.mark.parametrize("size", [1 << 16, 3 << 20])
def test_enospc_is_a_clear_segment_error(monkeypatch, size):
    monkeypatch.setattr(segment.os, "posix_fallocate", enospc)
    fds = open_fds()
    with pytest.raises(shmcoll.SegmentError) as ei:
        Segment.create(size)
    e = ei.value
    assert isinstance(e, OSError) and isinstance(e, shmcoll.ShmcollError)
    assert e.errno == errno.ENOSPC
    msg = str(e)
    assert "/dev/shm" in msg and str(size) in msg and "SHMCOLL_CHAN_BYTES" in msg
    assert segment.leftovers() == []
    # (the failed create's mmap lives on in the traceback's frame until the
    # exception is dropped; after that nothing may remain open)
    del e, ei
    assert open_fds() == fds, "the segment's descriptor leaked"


def test_enospc_fails_launch_before_any_rank_runs(monkeypatch):
    monkeypatch.setattr(segment.os, "posix_fallocate", enospc)
    ran = shared_array(1, np.int64)

    def job(comm):
        ran[0] = 1
    with pytest.raises(shmcoll.SegmentError, match="/dev/shm"):
        run_ranks(job, 2)
    assert ran[0] == 0


def test_creation_failure_is_a_segment_error(monkeypatch):
    def refuse(*a, **k):
        raise posix_ipc.ExistentialError("refused for the test")
    monkeypatch.setattr(segment.posix_ipc, "SharedMemory", refuse)
    with pytest.raises(shmcoll.SegmentError, match="refused for the test"):
        Segment.create(1 << 16)


def test_failure_after_creation_unlinks_and_closes(monkeypatch):
    def boom(fd, size):
        raise OSError(errno.EIO, "ftruncate failed for the test")
    monkeypatch.setattr(segment.os, "ftruncate", boom)
    fds = open_fds()
    with pytest.raises(OSError, match="for the test") as ei:
        Segment.create(1 << 16)
    assert segment.leftovers() == []
    del ei
    assert open_fds() == fds


# -- reservation failure, for real: a 1 MiB /dev/shm in a private mount namespace ----

CHILD = textwrap.dedent("""
    import json, os, subprocess, sys
    import shmcoll
    from shmcoll import segment
    out = {}
    def job(comm):
        return comm.rank
    try:
        shmcoll.launch(job, 2, options={"chan_bytes": 8 << 20}, timeout=60)
        out["big"] = None
    except Exception as e:
        out["big"] = [type(e).__name__, str(e), isinstance(e, shmcoll.SegmentError), getattr(e, "errno", None)]
    out["left_big"] = segment.leftovers()
    out["listing"] = os.listdir("/dev/shm")
    out["small"] = shmcoll.launch(job, 2, options={"chan_bytes": 8192}, timeout=60)
    env = dict(os.environ, SHMCOLL_CHAN_BYTES=str(8 << 20))
    p = subprocess.run([sys.executable, "-m", "shmcoll", "run", "-n", "2", "--", "-c", "print('ran')"],
                       env=env, capture_output=True, text=True, timeout=60)
    out["cli"] = [p.returncode, p.stdout, p.stderr[-2000:]]
    out["left_end"] = os.listdir("/dev/shm")
    print("RESULT " + json.dumps(out))
""")


def test_full_dev_shm_for_real():
    if shutil.which("unshare") is None:
        pytest.skip("unshare(1) is not installed")
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode:
        pytest.skip(f"cannot mount a private tmpfs on /dev/shm: {probe.stderr.strip()}")
    cmd = f"mount -t tmpfs -o size=1m tmpfs /dev/shm && exec {sys.executable} -c \"$CHILD\""
    p = subprocess.run(["unshare", "-m", "sh", "-c", cmd], env=dict(os.environ, CHILD=CHILD), cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, p.stdout + p.stderr
    out = json.loads(line[-1][len("RESULT "):])
    name, msg, is_seg, err = out["big"]
    assert is_seg, out["big"]
    assert name == "SegmentError" and err == errno.ENOSPC and "/dev/shm" in msg, out["big"]
    assert out["left_big"] == [] and out["listing"] == [], out
    assert out["small"] == [0, 1]                     # a job that fits still runs
    code, stdout, stderr = out["cli"]
    assert code != 0 and "ran" not in stdout and "SegmentError" in stderr and "/dev/shm" in stderr, out["cli"]
    assert out["left_end"] == []


# -- privacy and lifetime -------------------------------------------------------------

@pytest.mark.parametrize("umask", [0o022, 0o000, 0o077])
def test_segment_is_private_and_unlinked(umask):
    old = os.umask(umask)
    try:
        seg = Segment.create(1 << 16)
    finally:
        os.umask(old)
    try:
        st = os.fstat(seg.fd)
        assert st.st_mode & 0o777 == 0o600
        assert st.st_nlink == 0, "the segment still has a name"
        assert st.st_size >= 1 << 16
        assert segment.leftovers() == []
    finally:
        seg.mmap.close()
        seg.close_fd()
        seg.close_fd()                    # idempotent
    assert seg.fd == -1


def test_name_is_gone_before_pages_are_reserved(monkeypatch):
    """The name is unlinked right after it is opened: even a launcher killed
    while a big segment is being placed and reserved leaves nothing."""
    seen = []
    real = segment.reserve

    def spy(fd, size):
        seen.append((segment.leftovers(), os.fstat(fd).st_mode & 0o777))
        return real(fd, size)
    monkeypatch.setattr(segment, "reserve", spy)
    seg = Segment.create(1 << 16)
    try:
        assert len(seen) == 1
        names, mode = seen[0]
        assert names == []
        assert mode == 0o600
        assert segment.leftovers() == []
    finally:
        seg.mmap.close()
        seg.close_fd()


def test_from_fd_maps_the_same_memory():
    seg = Segment.create(1 << 16)
    other = Segment.from_fd(os.dup(seg.fd), seg.size)
    try:
        seg.mmap[100:105] = b"hello"
        assert other.mmap[100:105] == b"hello"
    finally:
        for s in (seg, other):
            s.mmap.close()
            s.close_fd()


def test_reserved_pages_are_really_reserved():
    """posix_fallocate reserved the pages: the file's blocks cover it."""
    seg = Segment.create(1 << 20)
    try:
        assert os.fstat(seg.fd).st_blocks * 512 >= 1 << 20
    finally:
        seg.mmap.close()
        seg.close_fd()


def _rank_segment(comm):
    st = os.fstat(comm._dev.segment.fd)
    return st.st_mode & 0o777, st.st_nlink, sorted(segment.leftovers())


@pytest.mark.parametrize("n", [1, 3])
def test_ranks_share_an_unnamed_private_segment(n):
    for mode, nlink, left in run_ranks(_rank_segment, n):
        assert (mode, nlink, left) == (0o600, 0, [])


def test_run_ranks_share_an_unnamed_private_segment():
    code = ("import os, shmcoll; c = shmcoll.init(); st = os.fstat(int(os.environ['SHMCOLL_FD'])); "
            "os.write(1, f'{c.rank} {st.st_mode & 0o777:o} {st.st_nlink}\\n'.encode())")
    p = subprocess.run([sys.executable, "-m", "shmcoll", "run", "-n", "2", "--", "-c", code],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == ["0 600 0", "1 600 0"]


def test_leftovers_lists_only_shmcoll_names(monkeypatch):
    monkeypatch.setattr(segment.os, "listdir", lambda path: ["shmcoll-b", "other", "sem.x", "shmcoll-a"])
    assert segment.leftovers() == ["shmcoll-a", "shmcoll-b"]
