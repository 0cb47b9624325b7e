#!/usr/bin/env python3
"""Run mpi4py 4.1.2's own tests, unedited, on shmcoll (or on a real mpi4py).

    python3 tools/mpi4py_tests.py [-n 1,2,3,4] [--peer /tmp/peer-mpich] [FILE ...]

The sdist is fetched once with pip (the index pip here is configured with)
into --cache (default ~/.cache/shmcoll); its test/ and demo/ are extracted
there.  Each test file runs under `shmcoll run -n N` (or the peer's mpiexec
with --peer) as this same script in --rank mode: it puts tools/mpi4py_shim
first on sys.path, so the tests' `from mpi4py import MPI` is shmcoll.MPI
(--peer: the real mpi4py), skips the tests that tools/mpi4py_skips.txt
names, with its reasons, and writes one JSON line per test event.  A test
passes when it passes on every rank; one that gives no result on some rank
(hang, crash) fails.  Exit status 1 when any test fails, 0 when all pass or
when shmcoll.MPI does not exist yet (said on one line).  --check-main also
runs mpi4py's own test/main.py under the peer and compares the counts (the
check that this machinery counts as mpi4py does: use it with --no-skips).
Rank mode imports nothing from shmcoll itself: under --peer it runs in the
peer's interpreter.
"""
import argparse
import fnmatch
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
import unittest
from pathlib import Path

VERSION = "4.1.2"
SHA256 = "56860286dc45f20e8821e93cb06669e30462348bf866f685553fa4b712d58d02"
FILES = ["test_p2p_buf.py", "test_p2p_obj.py", "test_cco_buf.py", "test_cco_obj.py", "test_cco_vec.py",
         "test_cco_nb_buf.py", "test_cco_nb_vec.py", "test_comm.py", "test_request.py", "test_status.py",
         "test_datatype.py", "test_msgspec.py", "test_cco_pr_buf.py"]
TOOLS = Path(__file__).resolve().parent
SHIM = TOOLS / "mpi4py_shim"
SKIPS = TOOLS / "mpi4py_skips.txt"


class FetchError(Exception):
    pass


def fetch(cache):
    """The extracted sdist root (holding test/ and demo/), fetched and checked against SHA256 once."""
    cache = Path(cache).expanduser()
    root = cache / f"mpi4py-{VERSION}"
    if (root / "test" / "main.py").is_file() and (root / "demo").is_dir():
        return root
    cache.mkdir(parents=True, exist_ok=True)
    tarball = cache / f"mpi4py-{VERSION}.tar.gz"
    if not tarball.is_file():
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            # --no-build-isolation: pip may prepare the sdist's metadata, which
            # must not download a build backend.
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                   "--no-build-isolation", "--retries", "1", "--timeout", "30", f"mpi4py=={VERSION}", "-d", tmp]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            got = Path(tmp) / tarball.name
            if p.returncode or not got.is_file():
                raise FetchError(f"pip download of mpi4py {VERSION}'s sdist failed: "
                                 f"{(p.stderr or p.stdout).strip().splitlines()[-1:]}")
            shutil.move(got, tarball)
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    if digest != SHA256:
        raise FetchError(f"{tarball}: sha256 {digest}, expected {SHA256}")
    prefix = f"mpi4py-{VERSION}/"
    with tarfile.open(tarball) as tf:
        members = [m for m in tf.getmembers() if m.name.startswith((prefix + "test/", prefix + "demo/"))]
        tf.extractall(cache, members=members, filter="data")
    return root


def load_skips(path):
    """[(glob over test ids, reason)] from lines `GLOB REASON`; '#' starts a comment line."""
    skips = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        glob, _, reason = line.partition(" ")
        if not reason.strip():
            raise ValueError(f"{path}:{n}: a skip needs a reason: {line!r}")
        skips.append((glob, reason.strip()))
    return skips


# ---- rank mode: one rank's run of one test file ----

class _Recorder(unittest.TestResult):
    """Writes each test's start and outcome as a JSON line as it happens, so a hang shows where."""

    def __init__(self, out):
        super().__init__()
        self.out = out

    def _put(self, test, outcome, detail=""):
        self.out.write(json.dumps({"test": test.id(), "outcome": outcome, "detail": detail}) + "\n")
        self.out.flush()

    def startTest(self, test):
        super().startTest(test)
        self._put(test, "start")

    def addSuccess(self, test):
        super().addSuccess(test)
        if not getattr(test, "_subfailed", False):
            self._put(test, "pass")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._put(test, "fail", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._put(test, "fail", self._exc_info_to_string(err, test))

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            test._subfailed = True
            self._put(test, "fail", f"{subtest}: " + self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._put(test, "skip", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._put(test, "pass", "expected failure")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._put(test, "fail", "unexpected success")


def _tests(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from _tests(t)
        else:
            yield t


def rank_main(a):
    if a.shim:
        sys.path.insert(0, str(SHIM))
    sys.path.insert(0, a.testdir)
    # As mpi4py's test/main.py does: test with numpy and array only.
    sys.modules["cupy"] = sys.modules["numba"] = None
    if a.face:      # shmcoll.MPI across (virtual) nodes: mpi4py's MPI, COMM_WORLD hierarchical
        import mpi4py
        import shmcoll.MPI
        sys.modules["mpi4py.MPI"] = mpi4py.MPI = shmcoll.MPI
    from mpi4py import MPI
    rank = MPI.COMM_WORLD.Get_rank()
    skips = load_skips(a.skips) if a.skips else []
    mod = Path(a.files[0]).stem
    with open(Path(a.outdir) / f"rank{rank}.jsonl", "w") as out:
        try:
            suite = unittest.defaultTestLoader.loadTestsFromName(mod)
        except Exception:
            out.write(json.dumps({"test": mod, "outcome": "fail", "detail": traceback.format_exc()}) + "\n")
            return 0
        for t in _tests(suite):
            for glob, reason in skips:
                if fnmatch.fnmatchcase(t.id(), glob):
                    name = t._testMethodName
                    setattr(t, name, unittest.skip(f"[mpi4py_skips] {reason}")(getattr(t, name)))
                    break
        suite.run(_Recorder(out))
    return 0


# ---- driver ----

def _launch(a, n, file, outdir, testdir, peer, skips):
    me = [str(Path(__file__).resolve()), "--rank", "--testdir", str(testdir), "--outdir", str(outdir), file]
    if skips:
        me[2:2] = ["--skips", str(skips)]
    env = dict(os.environ)
    if peer is None:
        me.insert(2, "--shim")
        cmd = [sys.executable, "-m", "shmcoll", "run", "-n", str(n), "--bind", "none", "--"] + me
    else:
        cmd = [str(peer / "bin" / "mpiexec"), "-n", str(n)]
        if a.nodes:
            me.insert(2, "--face")
            env["SHMCOLL_VIRTUAL_NODES"] = a.nodes
        if (peer / "bin" / "ompi_info").exists():
            cmd += ["--oversubscribe", "-x", "SHMCOLL_VIRTUAL_NODES"] if a.nodes else ["--oversubscribe"]
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        cmd += [str(peer / "bin" / "python")] + me
    return run_logged(cmd, outdir / "output.log", a.timeout, env)


def run_logged(cmd, log, timeout, env=None):
    """(exit status or 'timeout', seconds): cmd's output to log; its process group killed at timeout."""
    t0 = time.monotonic()
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = p.wait(timeout)
        except subprocess.TimeoutExpired:
            for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, None)):
                try:
                    os.killpg(p.pid, sig)
                    p.wait(grace)
                    break
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    pass
            rc = "timeout"
    return rc, time.monotonic() - t0


def tally(outdir, n, rc):
    """{test id: (outcome, detail)} over n ranks: pass on all ranks, skip on all, else fail."""
    per = {}
    for r in range(n):
        path = outdir / f"rank{r}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        for ev in map(json.loads, lines):
            per.setdefault(ev["test"], {})[r] = (ev["outcome"], ev["detail"])
    res = {}
    for tid, ranks in per.items():
        outs = {r: ranks.get(r, ("missing", "")) for r in range(n)}
        bad = [(r, o, d) for r, (o, d) in outs.items() if o not in ("pass", "skip")]
        if bad:
            r, o, d = bad[0]
            why = {"start": f"no result on rank {r} (launcher: {rc})", "missing": f"never ran on rank {r}"}
            res[tid] = ("fail", why.get(o, f"rank {r}: {d}"))
        elif all(o == "skip" for o, _ in outs.values()):
            res[tid] = ("skip", outs[0][1])
        elif all(o == "pass" for o, _ in outs.values()):
            res[tid] = ("pass", "")
        else:
            res[tid] = ("fail", "skipped on some ranks only")
    if rc not in (0, "timeout") and not any(o == "fail" for o, _ in res.values()):
        res["<launcher>"] = ("fail", f"exit status {rc}, see {outdir / 'output.log'}")
    if rc == "timeout" and not res:
        res["<launcher>"] = ("fail", "timed out before any test started")
    return res


def main_counts(peer, testdir, n, file, log, timeout):
    """(ran, skipped, failed) that mpi4py's own test/main.py reports, or None."""
    cmd = [str(peer / "bin" / "mpiexec"), "-n", str(n)]
    env = dict(os.environ)
    if (peer / "bin" / "ompi_info").exists():
        cmd.append("--oversubscribe")
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd += [str(peer / "bin" / "python"), str(testdir / "main.py"), Path(file).stem]
    run_logged(cmd, log, timeout, env)
    text = log.read_text()
    ran = re.findall(r"^Ran (\d+) tests?", text, re.M)
    if not ran:
        return None
    tail = re.findall(r"^(OK|FAILED)(?: \((.*)\))?$", text, re.M)
    kw = dict(re.findall(r"(\w+)=(\d+)", tail[0][1] or "")) if tail else {}
    failed = int(kw.get("failures", 0)) + int(kw.get("errors", 0))
    return int(ran[0]), int(kw.get("skipped", 0)), failed


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help=f"test files (default: the {len(FILES)} of issue 44)")
    ap.add_argument("-n", default="1,2,3,4", help="rank counts, comma-separated (default 1,2,3,4)")
    ap.add_argument("--cache", default="~/.cache/shmcoll", help="where the sdist is fetched and extracted")
    ap.add_argument("--peer", type=Path, help="run the real mpi4py of this peer venv under its mpiexec")
    ap.add_argument("--no-skips", action="store_true", help=f"ignore {SKIPS.name} (run every test)")
    ap.add_argument("--check-main", action="store_true",
                    help="with --peer: also run mpi4py's test/main.py and compare its counts")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per file and rank count (default 300)")
    ap.add_argument("--out", type=Path, help="work directory for logs (default: a temporary one)")
    ap.add_argument("--json", type=Path, help="write {file: {N: {test id: [outcome, detail]}}} here")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each failure's detail")
    ap.add_argument("--nodes", help="with --peer: ranks per virtual node (SHMCOLL_VIRTUAL_NODES, e.g. 2,2; -n is "
                    "their sum), the tests' `from mpi4py import MPI` being shmcoll.MPI's hierarchical face")
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--face", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--shim", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--testdir", help=argparse.SUPPRESS)
    ap.add_argument("--outdir", help=argparse.SUPPRESS)
    ap.add_argument("--skips", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv=None):
    a = parse_args(argv)
    if a.rank:
        return rank_main(a)
    if a.peer is None:
        try:
            import shmcoll.MPI  # noqa: F401
        except ImportError as e:
            print(f"mpi4py_tests: SKIP: shmcoll.MPI cannot be imported ({e}); nothing to test yet")
            return 0
    try:
        root = fetch(a.cache)
    except (FetchError, OSError, subprocess.SubprocessError) as e:
        print(f"mpi4py_tests: SKIP: mpi4py {VERSION}'s sdist is not available: {e}")
        return 0
    testdir = root / "test"
    if a.nodes and not a.peer:
        raise SystemExit("mpi4py_tests: --nodes needs --peer (the MPI library between the nodes)")
    ns = [sum(int(x) for x in a.nodes.split(","))] if a.nodes else [int(x) for x in a.n.split(",")]
    files = a.files or FILES
    skips = None if a.no_skips else SKIPS
    work = a.out or Path(tempfile.mkdtemp(prefix="mpi4py_tests."))
    who = f"mpi4py+{a.peer}" if a.peer else "shmcoll"
    if a.nodes:
        who = f"shmcoll.MPI over mpi4py+{a.peer}, virtual nodes {a.nodes}"
    print(f"mpi4py {VERSION} tests on {who}; logs in {work}")
    print(f"{'file':<22}{'N':>3}{'ran':>6}{'passed':>8}{'failed':>8}{'skipped':>9}{'s':>7}"
          + ("  main.py ran/skipped/failed" if a.check_main else ""))
    total = dict(ran=0, passed=0, failed=0, skipped=0)
    report, mismatch = {}, 0
    for file in files:
        for n in ns:
            outdir = work / Path(file).stem / f"n{n}"
            outdir.mkdir(parents=True, exist_ok=True)
            rc, secs = _launch(a, n, file, outdir, testdir, a.peer, skips)
            res = tally(outdir, n, rc)
            report.setdefault(file, {})[n] = res
            c = {k: sum(o == k for o, _ in res.values()) for k in ("pass", "fail", "skip")}
            row = dict(ran=len(res), passed=c["pass"], failed=c["fail"], skipped=c["skip"])
            for k in total:
                total[k] += row[k]
            line = (f"{Path(file).stem:<22}{n:>3}{row['ran']:>6}{row['passed']:>8}{row['failed']:>8}"
                    f"{row['skipped']:>9}{secs:>7.1f}")
            if a.check_main and a.peer:
                ref = main_counts(a.peer, testdir, n, file, outdir / "main.log", a.timeout)
                mine = (row["ran"], row["skipped"], row["failed"])
                same = ref == mine
                mismatch += not same
                line += f"  {ref[0]}/{ref[1]}/{ref[2]} {'same' if same else 'DIFFERENT'}" if ref else "  none"
            print(line, flush=True)
            if a.verbose:
                for tid, (o, d) in res.items():
                    if o == "fail":
                        print(f"    FAIL {tid}: {d.strip().splitlines()[-1] if d.strip() else ''}")
    print(f"{'total':<25}{total['ran']:>6}{total['passed']:>8}{total['failed']:>8}{total['skipped']:>9}")
    if a.json:
        a.json.write_text(json.dumps(report, indent=1))
    return 1 if total["failed"] or mismatch else 0


if __name__ == "__main__":
    sys.exit(main())
