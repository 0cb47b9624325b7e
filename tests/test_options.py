"""Tunables: argument (options=) > environment (SHMCOLL_<NAME>) > default;
unknown names are rejected; values reach every rank's plan and C context."""
import json
import os
import re
import subprocess
import sys

import pytest

import shmcoll
from shmcoll import options
from shmcoll.coll import select
from shmcoll.options import DEFAULTS, resolve
from conftest import run_ranks

ALG_OPTS = {f"{op}_algorithm" for op in select.TABLE}


def env_name(name):
    return "SHMCOLL_" + name.upper()


def sample(name, k=1):
    """A valid non-default value for option `name`."""
    if name in ALG_OPTS:
        op = name[:-len("_algorithm")]
        return shmcoll.algorithms(op)[k % len(shmcoll.algorithms(op))]
    if name in options.TEXT:
        return f"/tmp/{name}-{k}.json"
    return 4096 * (k + 1) + k


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in DEFAULTS:
        monkeypatch.delenv(env_name(name), raising=False)


@pytest.mark.parametrize("name", list(DEFAULTS))
def test_precedence_for_every_option(name):
    arg, env = sample(name, 1), sample(name, 2)
    env_text = env if isinstance(env, str) else str(env)
    assert resolve({}, {})[name] == (DEFAULTS[name], "default")
    assert resolve({}, {env_name(name): env_text})[name] == (env, "environment")
    assert resolve({name: arg}, {env_name(name): env_text})[name] == (arg, "argument")
    assert resolve({name: arg}, {})[name] == (arg, "argument")
    # None in options means "not given": the environment still applies
    assert resolve({name: None}, {env_name(name): env_text})[name] == (env, "environment")
    # an empty variable is unset
    assert resolve({}, {env_name(name): ""})[name] == (DEFAULTS[name], "default")


def test_resolve_covers_every_option_once():
    out = resolve()
    assert set(out) == set(DEFAULTS)


@pytest.mark.parametrize("bad", [{"chunk_size": 1}, {"bogus": 1, "chan_bytes": 8192}, {"Chan_Bytes": 8192}])
def test_unknown_option_rejected(bad):
    with pytest.raises(ValueError) as ei:
        resolve(bad, {})
    for k in bad:
        if k not in DEFAULTS:
            assert k in str(ei.value)


def test_unknown_option_rejected_by_launch():
    def job(comm):
        return 1
    with pytest.raises(ValueError, match="chunk_size"):
        run_ranks(job, 2, options={"chunk_size": 4096})


@pytest.mark.parametrize("text,value", [("4096", 4096), ("0x2000", 8192), ("1e6", 1000000), ("2E3", 2000),
                                        ("0o10", 8), ("  77 ", 77),
                                        ("0x1e00", 0x1e00), ("0xE0", 0xE0)])
def test_environment_integer_forms(text, value):
    assert resolve({}, {"SHMCOLL_CHUNK_BYTES": text})["chunk_bytes"] == (value, "environment")


@pytest.mark.parametrize("text", ["lots", "4k", "1.5.2"])
def test_environment_bad_integer(text):
    with pytest.raises(ValueError) as ei:
        resolve({}, {"SHMCOLL_CHUNK_BYTES": text})
    assert "SHMCOLL_CHUNK_BYTES" in str(ei.value) and text in str(ei.value)


@pytest.mark.parametrize("name,value,want", [("inline_bytes", 4096.0, 4096), ("chunk_bytes", "0x1000", 4096),
                                              ("timeout", 2.5, 2.5), ("check", True, 1), ("adapt", 0, 0)])
def test_argument_number_forms(name, value, want):
    assert resolve({name: value}, {})[name] == (want, "argument")


@pytest.mark.parametrize("value", [1.5, True, "abc", float("nan"), [4096]])
def test_argument_bad_number(value):
    """Review of c5beaf2: options={"inline_bytes": 1.5} or True ran as 1,
    and "abc" raised a ValueError that did not name the option."""
    with pytest.raises(ValueError, match="option inline_bytes="):
        resolve({"inline_bytes": value}, {})


def test_every_option_has_a_unit_and_a_meaning():
    assert list(options.OPTIONS) == list(DEFAULTS)
    for name, option in options.OPTIONS.items():
        assert option.default == DEFAULTS[name] and option.meaning, name
        assert option.unit in {"bytes", "ns", "s", "0/1", "calls", "ranks", "slots", "path", "name"}, name
        assert (option.unit in ("path", "name")) == (name in options.TEXT), name


def table_rows(text):
    """{name: its columns} of describe's one-line-per-option table, header first."""
    lines = text.splitlines()
    assert lines[0].split() == ["name", "value", "unit", "default", "source", "meaning"]
    return {line.split()[0]: line.split(maxsplit=5) for line in lines[1:]}


def test_describe_names_every_source():
    text = options.describe(resolve({"tile_bytes": 8192}, {"SHMCOLL_CHUNK_BYTES": "4096"}))
    rows = table_rows(text)
    assert set(rows) == set(DEFAULTS)
    assert rows["tile_bytes"][:5] == ["tile_bytes", "8192", "bytes", "derived", "argument"]
    assert rows["chunk_bytes"][:5] == ["chunk_bytes", "4096", "bytes", "derived", "environment"]
    assert rows["chan_bytes"][:5] == ["chan_bytes", "2097152", "bytes", "2097152", "default"]
    assert rows["bcast_algorithm"][1] == rows["tuning_file"][1] == "unset"
    for name, row in rows.items():
        assert row[5] == options.OPTIONS[name].meaning      # whole, one line each: for grep


@pytest.mark.parametrize("width,under", [(150, False), (80, True)])
def test_describe_wraps_the_meaning_to_a_terminal(width, under):
    """Each option's columns start a line; its meaning wraps beside them, or under them (indented)
    where the terminal leaves it too little room; a long path keeps its end."""
    path = "/a/very/long/directory/that/holds/the/tuning.json"
    text = options.describe(resolve({"tuning_file": path}, {}), width)
    lines = text.splitlines()
    assert all(len(line) <= width for line in lines)
    starts = [line.split()[0] for line in lines if not line.startswith(" ")]
    assert starts == ["name"] + list(DEFAULTS)
    tuning = next(line for line in lines if line.startswith("tuning_file"))
    assert path not in tuning and "/tuning.json" in tuning.split()[1]
    assert lines[1].startswith("    ") == under


def test_options_cli_reports_the_environment():
    env = dict(os.environ, SHMCOLL_CHUNK_BYTES="12288")
    p = subprocess.run([sys.executable, "-m", "shmcoll", "options"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    line = next(x for x in p.stdout.splitlines() if x.startswith("chunk_bytes"))
    assert line.split()[1:5] == ["12288", "bytes", "derived", "environment"]
    assert p.stdout.splitlines()[-2].startswith("tuning file in use: ")
    assert p.stdout.splitlines()[-1].startswith("model: ")


def test_options_cli_json():
    env = dict(os.environ, SHMCOLL_CHUNK_BYTES="12288")
    p = subprocess.run([sys.executable, "-m", "shmcoll", "options", "--json"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["options"] == options.rows(resolve({}, env))
    assert doc["options"]["chunk_bytes"] == {"value": 12288, "unit": "bytes", "default": None,
                                             "source": "environment", "meaning": options.OPTIONS["chunk_bytes"].meaning,
                                             "env": "SHMCOLL_CHUNK_BYTES"}
    assert set(doc["tuning_file"]) == {"path", "status"} and set(doc["model"]) == {"params", "asked"}


@pytest.mark.parametrize("args", [[], ["--json"]])
def test_options_cli_into_a_closed_pipe_ends_quietly(args):
    """As into `head`: the reader gone before the first line, no traceback and status 0."""
    r, w = os.pipe()
    p = subprocess.Popen([sys.executable, "-m", "shmcoll", "options", *args], stdout=w, stderr=subprocess.PIPE,
                         text=True)
    os.close(w)
    os.close(r)         # long before the interpreter has started and printed
    _, err = p.communicate(timeout=60)
    assert (p.returncode, err) == (0, "")


# -- through launch(): what every rank's plan and C context hold -------------------

def _params(comm):
    p = comm.plan.params
    c = comm._c
    return {k: p[k] for k in ("chan_bytes", "chunk_bytes", "tile_bytes", "check", "bcast_k", "nt_bytes")}, \
           {k: getattr(c, k) for k in ("chan_bytes", "check")}


def test_launch_precedence(monkeypatch):
    monkeypatch.setenv("SHMCOLL_CHUNK_BYTES", "2048")
    monkeypatch.setenv("SHMCOLL_TILE_BYTES", "3072")
    monkeypatch.setenv("SHMCOLL_CHECK", "1")
    got = run_ranks(_params, 3, options={"chunk_bytes": 4096, "bcast_k": 2, "check": None})
    for plan, ctx in got:
        assert {k: plan[k] for k in ctx} == ctx, "the plan and the C context disagree"
        assert plan["chunk_bytes"] == 4096      # argument over environment
        assert plan["tile_bytes"] == 3072       # environment over default
        assert plan["check"] == 1               # None argument: environment
        assert plan["bcast_k"] == 2
        assert plan["chan_bytes"] == DEFAULTS["chan_bytes"]
        topo = shmcoll.topology()
        assert plan["nt_bytes"] == (topo.shared_cache_size() or topo.cache_size(2) or 1 << 20)  # derived


@pytest.mark.parametrize("given,want", [(5000, 8192), (8192, 8192), (1, 8192), (12289, 16384)])
def test_chan_bytes_rounded_to_pages(given, want):
    for plan, ctx in run_ranks(_params, 2, options={"chan_bytes": given}):
        assert plan["chan_bytes"] == ctx["chan_bytes"] == want


def _selected(comm):
    return (comm.selected("barrier", 0), comm.selected("bcast", 8), comm.selected("bcast", 1 << 20),
            comm.selected("alltoall", 8), comm.selected("alltoall", 1 << 20))


@pytest.mark.parametrize("op,alg", [(op, a) for op in ("barrier", "bcast", "alltoall")
                                    for a in shmcoll.algorithms(op)])
def test_algorithm_forced_by_environment_and_argument(op, alg, monkeypatch):
    idx = {"barrier": [0], "bcast": [1, 2], "alltoall": [3, 4]}[op]
    monkeypatch.setenv(env_name(op + "_algorithm"), alg)
    for sel in run_ranks(_selected, 3, topology="2x2"):
        assert [sel[i] for i in idx] == [alg] * len(idx)
    other = [a for a in shmcoll.algorithms(op) if a != alg][0]
    for sel in run_ranks(_selected, 3, topology="2x2", options={op + "_algorithm": other}):
        assert [sel[i] for i in idx] == [other] * len(idx)


def test_auto_algorithm_means_automatic(monkeypatch):
    auto = run_ranks(_selected, 3, topology="2x2")
    monkeypatch.setenv("SHMCOLL_BCAST_ALGORITHM", "auto")
    assert run_ranks(_selected, 3, topology="2x2", options={"alltoall_algorithm": "auto"}) == auto


@pytest.mark.parametrize("op", ["barrier", "bcast", "alltoall"])
def test_bad_algorithm_option_rejected(op, monkeypatch):
    with pytest.raises(ValueError, match="nope"):
        run_ranks(_selected, 2, options={op + "_algorithm": "nope"})
    monkeypatch.setenv(env_name(op + "_algorithm"), "nope")
    with pytest.raises(ValueError, match="nope"):
        run_ranks(_selected, 2)


def test_algorithms_lists():
    assert shmcoll.algorithms("bcast") == ["binomial", "original", "limited", "numa"]
    assert shmcoll.algorithms("alltoall") == ["bruck", "all_at_once", "pairwise", "tiled"]
    assert shmcoll.algorithms("allgather") == ["ring", "recursive_doubling", "bruck", "neighbor_exchange",
                                               "all_at_once"]
    assert shmcoll.algorithms("allreduce") == ["all_at_once", "reduce_scatter_allgather", "numa"]
    assert shmcoll.algorithms("reduce") == ["flat", "reduce_scatter_gather", "numa"]
    assert shmcoll.algorithms("alltoallv") == shmcoll.algorithms("alltoallw") == ["pairwise", "all_at_once"]
    with pytest.raises(ValueError, match="neighbor_alltoallv"):
        shmcoll.algorithms("neighbor_alltoallv")


def test_environment_is_read_at_launch(monkeypatch):
    monkeypatch.setenv("SHMCOLL_CHUNK_BYTES", "8192")
    first = run_ranks(_params, 2)
    monkeypatch.setenv("SHMCOLL_CHUNK_BYTES", "16384")
    second = run_ranks(_params, 2)
    assert [p["chunk_bytes"] for p, _ in first] == [8192] * 2
    assert [p["chunk_bytes"] for p, _ in second] == [16384] * 2


# -- a collective in select.TABLE brings its options row, its environment
# variable and its line in the docs' algorithm table ---------------------------
def _every_selected(comm):
    return {op: comm.selected(op, 1 << 12) for op in select.TABLE}


@pytest.mark.parametrize("end", [0, -1])
def test_every_collective_algorithm_is_forced_by_its_environment_variable(monkeypatch, end):
    """SHMCOLL_<OP>_ALGORITHM for every TABLE row, each naming its first
    (then its last) algorithm: every rank selects that one."""
    want = {op: select.algorithms(op)[end] for op in select.TABLE}
    for op in select.TABLE:
        assert f"{op}_algorithm" in DEFAULTS, f"{op} has no options row"
        monkeypatch.setenv(env_name(f"{op}_algorithm"), want[op])
    assert run_ranks(_every_selected, 2) == [want] * 2


def _docs_table():
    """{method names in the first column: the row} of the docs' algorithm
    table (docs/algorithms.md where it exists, else README.md's
    "Algorithms" section); "Gather(v)" names Gather and Gatherv."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "docs", "algorithms.md")
    if os.path.exists(path):
        text = open(path).read()
    else:
        text = open(os.path.join(root, "README.md")).read()
        text = text[text.index("### Algorithms"):]
    rows = {}
    for line in text.splitlines():
        if not line.startswith("|"):
            if rows:
                break
            continue
        first = line.split("|")[1].strip()
        for cell in first.split(","):
            m = re.fullmatch(r"\s*(\w+?)(?:\((\w+)\))?\s*", cell)
            if m:
                rows[m.group(1)] = line
                if m.group(2):
                    rows[m.group(1) + m.group(2)] = line
    return rows


@pytest.mark.parametrize("op", list(select.TABLE))
def test_every_collective_is_in_the_docs_algorithm_table(op):
    rows = _docs_table()
    method = select.method(op)
    assert method in rows, f"{method} has no row in the docs' algorithm table"
    for name in select.algorithms(op):
        assert f"`{name}`" in rows[method], f"{method}'s row in the docs' algorithm table lacks `{name}`"
