"""`shmcoll run`'s Python ranks, forked from the launcher instead of exec'd.

A fresh interpreter per rank starts, imports numpy and shmcoll, at a few
hundred milliseconds of CPU each: hundreds of ranks on a few CPUs took
minutes to start.  The launcher process (the CLI: nothing imported but
shmcoll and numpy, no other threads) has paid that once; a forked rank
runs the script with runpy and ends as `python script.py` would: the
same sys.argv, sys.path[0], environment, exit status (SystemExit's code, 1
after an uncaught exception, SIGINT's after a KeyboardInterrupt), atexit
handlers and flushed output.  It never returns into the launcher: it ends
in os._exit."""
import atexit
import io
import os
import runpy
import signal
import sys
import threading
import traceback
import types

PYTHON_FLAGS = ("-m", "-c")


def is_python(cmd):
    """Whether cmd is what `python CMD...` runs (script, -m module, -c code)."""
    return bool(cmd) and (cmd[0] in PYTHON_FLAGS or cmd[0].endswith(".py"))


class Forked:
    """A forked rank, as much of subprocess.Popen as run() uses."""

    def __init__(self, pid, stdout, stderr):
        self.pid, self.stdout, self.stderr, self.returncode = pid, stdout, stderr, None

    def _status(self, st):
        self.returncode = -os.WTERMSIG(st) if os.WIFSIGNALED(st) else os.WEXITSTATUS(st)
        return self.returncode

    def wait(self):
        if self.returncode is None:
            self._status(os.waitpid(self.pid, 0)[1])
        return self.returncode

    def poll(self):
        if self.returncode is None:
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self._status(st)
        return self.returncode

    def kill(self):
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def start(cmd, env, prep, gate, closing):
    """Fork a rank that runs cmd (is_python) with env once gate (a pipe's
    read end) reaches EOF; prep() runs first in the child, closing are the
    launcher's descriptors it must not keep."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for fd in (out_r, err_r, *closing):
                os.close(fd)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            os.close(out_w)
            os.close(err_w)
            prep()
            while os.read(gate, 1):
                pass
            os.close(gate)
            code = _main(cmd, env)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(out_w)
    os.close(err_w)
    return Forked(pid, open(out_r, "rb"), open(err_r, "rb"))


def _main(cmd, env):
    """Run cmd as __main__ of this process; the exit status."""
    atexit._clear()             # a fresh interpreter's: none of the launcher's
    os.environ.clear()
    os.environ.update(env)
    # as a new interpreter writing to pipes: stdout block-buffered, stderr line-buffered
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding=sys.stdout.encoding,
                                                   errors=sys.stdout.errors)
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding=sys.stderr.encoding,
                                                   errors="backslashreplace", line_buffering=True)
    code, interrupted = 0, False
    try:
        if cmd[0] == "-m":
            sys.argv = [None, *cmd[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(cmd[1], run_name="__main__", alter_sys=True)
        elif cmd[0] == "-c":
            sys.argv = ["-c", *cmd[2:]]
            sys.path[0] = ""
            main = sys.modules["__main__"] = types.ModuleType("__main__")
            exec(compile(cmd[1], "<string>", "exec"), main.__dict__)
        elif not os.path.isfile(cmd[0]):
            print(f"{sys.executable}: can't open file {os.path.abspath(cmd[0])!r}: [Errno 2] No such file or directory",
                  file=sys.stderr)
            return _finish(2, False)
        else:
            sys.argv = list(cmd)
            sys.path[0] = os.path.dirname(os.path.abspath(cmd[0]))
            runpy.run_path(cmd[0], run_name="__main__")
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException as e:
        interrupted = isinstance(e, KeyboardInterrupt)
        sys.excepthook(type(e), e, e.__traceback__)
        code = 1
    return _finish(code, interrupted)


def _exit_code(e):
    """SystemExit's exit status, as the interpreter makes it."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xff
    print(e.code, file=sys.stderr)
    return 1


def _finish(code, interrupted):
    """The interpreter's exit: non-daemon threads, atexit handlers, flushed
    output; a KeyboardInterrupt ends the process by SIGINT."""
    try:
        threading._shutdown()
    except BaseException:
        pass
    atexit._run_exitfuncs()
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except BaseException:
            pass
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code
