"""Re-running a chapter as a reader does (issue 24): figures under any backend, a run that is always
one consistent pair, results next to their notebook, a readable page of the run, install paths,
read-only checkouts and the small refusals."""

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import nbformat
import pytest

from companion.book import cli, nbcompare, parameters, plotting, results
from companion.errors import InvalidInputError, ParameterError

ROOT = Path(__file__).resolve().parents[1]
CH02 = ROOT / "book" / "chapters" / "02_exact_learning.ipynb"


def _figure_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code" and any("image/png" in o.get("data", {}) for o in c.outputs)]


def _png_count(nb) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)


# -- 1. figures under any backend -------------------------------------------------------------------

def test_a_figure_displays_as_png_under_the_agg_backend():
    """With MPLBACKEND=Agg (set for the suite) IPython shows a figure's repr only, until plotting registers PNG."""
    import matplotlib
    from IPython.core.formatters import DisplayFormatter

    assert matplotlib.get_backend().lower() == "agg"
    shell = types.SimpleNamespace(display_formatter=DisplayFormatter())
    fig = plotting.lines([1, 2], {"a": [1.0, 2.0]}, xlabel="x", ylabel="y")
    assert "image/png" not in shell.display_formatter.format(fig)[0]      # the bug: a repr only
    assert plotting.show_figures_in(shell) is True
    data = shell.display_formatter.format(fig)[0]
    assert data["image/png"].startswith("iVBORw0KGgo") and data["text/plain"].startswith("<Figure size")  # base64 PNG


def test_an_existing_figure_format_is_kept():
    from IPython.core.formatters import DisplayFormatter
    from IPython.core.pylabtools import select_figure_formats

    shell = types.SimpleNamespace(display_formatter=DisplayFormatter())
    select_figure_formats(shell, {"svg"})
    plotting.show_figures_in(shell)
    data = shell.display_formatter.format(plotting.figure()[0])[0]
    assert "image/svg+xml" in data and "image/png" not in data


def test_a_missing_figure_is_a_difference():
    nb = nbformat.read(CH02, as_version=4)
    cell = _figure_cells(nb)[0]
    repr_only = [dict(o, data={k: v for k, v in o["data"].items() if k != "image/png"}) for o in cell.outputs]
    assert nbcompare.compare_figures(cell.outputs, cell.outputs) == []
    assert nbcompare.compare_figures(cell.outputs, repr_only) == [
        "figures: 0 image/png outputs where 1 are committed (a figure is missing)"]
    assert nbcompare.compare_outputs(cell.outputs, repr_only) != []        # nbval's comparison (conftest)
    assert nbcompare.compare_outputs(cell.outputs, cell.outputs) == []
    test = nbformat.read(CH02, as_version=4)
    _figure_cells(test)[1].outputs = repr_only
    assert list(nbcompare.compare_notebooks(nb, test)) == [
        [c for c in nb.cells if c.cell_type == "code"].index(_figure_cells(nb)[1])]


def test_the_build_finds_and_drops_a_cached_execution_without_figures(tmp_path):
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    cache = get_cache(str(tmp_path / "cache"))
    nb = nbformat.read(CH02, as_version=4)
    for c in _figure_cells(nb):
        c.outputs = [nbformat.from_dict(dict(o, data={k: v for k, v in o["data"].items() if k != "image/png"}))
                     for o in c.outputs]
    cache.cache_notebook_bundle(CacheBundleIn(nb, str(CH02)), overwrite=True)
    found = cli.cached_without_figures(tmp_path / "cache", {"02_exact_learning": CH02})
    assert list(found) == ["02_exact_learning"] and len(found["02_exact_learning"]) == 3
    cli._drop_cached(tmp_path / "cache", found, {"02_exact_learning": CH02})
    with pytest.raises(KeyError):
        cache.match_cache_notebook(nbformat.read(CH02, as_version=4))
    cache.cache_notebook_bundle(CacheBundleIn(nbformat.read(CH02, as_version=4), str(CH02)), overwrite=True)
    assert cli.cached_without_figures(tmp_path / "cache", {"02_exact_learning": CH02}) == {}
    assert cli.cached_without_figures(tmp_path / "none", {"02_exact_learning": CH02}) == {}


def _figureless_bundle(cache):
    from jupyter_cache.base import CacheBundleIn

    nb = nbformat.read(CH02, as_version=4)
    for c in _figure_cells(nb):
        c.outputs = [nbformat.from_dict(dict(o, data={k: v for k, v in o["data"].items() if k != "image/png"}))
                     for o in c.outputs]
    cache.cache_notebook_bundle(CacheBundleIn(nb, str(CH02)), overwrite=True)


def test_companion_build_re_executes_then_refuses_a_chapter_without_its_figures(tmp_path, monkeypatch, capsys):
    """The build itself (jupyter-book) is replaced by a stand-in that caches a figureless execution again."""
    from jupyter_cache import get_cache

    build = tmp_path / "_build"
    build.mkdir()
    (build / ".library-hash").write_text(results.library_hash() + "\n")       # the cache is current
    _figureless_bundle(get_cache(str(build / ".jupyter_cache")))
    calls = []

    def fake_build(cmd, env=None):
        calls.append(cmd)
        assert cli.cached_without_figures(build / ".jupyter_cache", cli.chapters()) == {}   # dropped first
        _figureless_bundle(get_cache(str(build / ".jupyter_cache")))          # executed, still no figures
        return 0

    monkeypatch.setattr(cli.subprocess, "call", fake_build)
    assert cli.main(["build", "-o", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert "the cached executions of 02_exact_learning lack figures the committed notebooks have: executing them again" in out
    assert calls and "--all" in calls[0] and calls[0][calls[0].index("--path-output") + 1] == str(tmp_path)
    assert err.startswith("companion: error: the book's execution of 02_exact_learning lacks figures the committed "
                          "notebooks have (02_exact_learning, code cell ")
    assert not (build / "html").exists()


# -- 3. no silent replacement ------------------------------------------------------------------------

def test_results_go_next_to_the_notebook_papermill_writes(monkeypatch, tmp_path):
    import IPython

    monkeypatch.delenv("COMPANION_RESULTS_DIR", raising=False)
    monkeypatch.setenv("PWD", str(tmp_path))
    shell = types.SimpleNamespace(user_ns={"PAPERMILL_OUTPUT_PATH": "elsewhere/x.ipynb"})
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    assert results.results_path("02_exact_learning") == tmp_path / "elsewhere" / "x.json"
    shell.user_ns["PAPERMILL_OUTPUT_PATH"] = "s3://bucket/x.ipynb"          # not a local notebook
    assert results.results_path("02_exact_learning").parent.name == "runs"


def test_runs_without_a_results_folder_never_replace_each_other(monkeypatch, tmp_path):
    monkeypatch.delenv("COMPANION_RESULTS_DIR", raising=False)
    monkeypatch.setattr(results, "results_dir", lambda: tmp_path)
    results.record_parameters("02_exact_learning", seed=1, glue=False)
    results.publish("x", 1, glue=False)
    first = results.load("02_exact_learning")
    results.record_parameters("02_exact_learning", seed=2, glue=False)
    results.publish("x", 2, glue=False)
    files = sorted(tmp_path.glob("02_exact_learning-*.json"))
    assert len(files) == 2
    assert sorted(json.loads(f.read_text())["seed"] for f in files) == [1, 2] and first["seed"] == 1
    assert results.load("02_exact_learning")["values"]["x"]["value"] == 2


def test_a_runs_kernel_talks_over_ipc_in_its_private_folder(tmp_path):
    """`companion run`'s kernel (companion.book._execute) binds IPC sockets in the run's private folder, not
    TCP ports: concurrent runs (the reproducibility suite runs two beside nbval) cannot race for the
    same port. A CI run failed that race with papermill's default TCP kernel ("Kernel died before
    replying to kernel_info"), so the suite re-executes chapters through `companion run`."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import json, ipykernel.connect\n"
        "info = ipykernel.connect.get_connection_info(unpack=True)\n"
        "print(json.dumps([info['transport'], info['ip']]))")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "in.ipynb")
    private = tmp_path / "private"
    private.mkdir()
    spec = {"input": str(tmp_path / "in.ipynb"), "output": str(tmp_path / "out.ipynb"), "parameters": {},
            "cwd": str(tmp_path), "progress_bar": False, "timeout": 120, "status": str(private / "status.json"),
            "runtime": str(private)}
    (private / "spec.json").write_text(json.dumps(spec))
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(private))
    proc = subprocess.run([sys.executable, "-m", "companion.book._execute", str(private / "spec.json")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((private / "status.json").read_text()) == {"ok": True}
    out = nbformat.read(tmp_path / "out.ipynb", as_version=4).cells[0].outputs[0]["text"]
    transport, ip = json.loads(out)
    assert transport == "ipc" and Path(ip).parent == private


@pytest.mark.slow
def test_plain_papermill_writes_the_results_next_to_its_notebook(tmp_path):
    """`papermill --inject-output-path ... elsewhere/x.ipynb` without COMPANION_RESULTS_DIR: elsewhere/x.json."""
    papermill = Path(sys.executable).with_name("papermill")
    env = {k: v for k, v in os.environ.items() if k != "COMPANION_RESULTS_DIR"}
    env["PWD"] = str(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    proc = subprocess.run([str(papermill), "--no-progress-bar", "--inject-output-path", "--cwd",
                           str(ROOT / "book" / "chapters"), str(ROOT / "book" / "chapters" / "01_definitions.ipynb"),
                           "elsewhere/x.ipynb", "-p", "n_checks", "50"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads((tmp_path / "elsewhere" / "x.json").read_text())
    assert data["chapter"] == "01_definitions" and data["parameters"]["n_checks"] == 50
    assert sorted(p.name for p in (tmp_path / "elsewhere").iterdir()) == ["x.ipynb", "x.json"]


def test_a_second_run_into_the_same_folder_is_refused(tmp_path, capsys):
    with cli._Lock(tmp_path, "04_low_rank"):
        assert cli.main(["run", "04", "-o", str(tmp_path)]) == 2
        err = capsys.readouterr().err
    assert err.strip() == (f"companion: error: another companion run of 04_low_rank (pid {os.getpid()}) is writing "
                           f"into {tmp_path}; wait for it to finish, or give this run another folder with -o DIR.")
    assert list(tmp_path.iterdir()) == []            # the lock file went with the run that held it


@pytest.mark.parametrize("path", [p for p in sorted((ROOT / "book" / "chapters").glob("0[12456]_*.ipynb"))],
                         ids=lambda p: p.stem)
def test_rerun_tips_say_where_the_results_go(path):
    nb = json.loads(path.read_text())
    tip = next("".join(c["source"]) for c in nb["cells"] if "Re-run this chapter" in "".join(c["source"]))
    assert "would overwrite the book" not in tip
    assert f"runs/{path.stem}.json" in tip and "never" in tip


# -- 6. read-only checkouts --------------------------------------------------------------------------

@pytest.fixture
def read_only(tmp_path):
    """A read-only bind mount (as a clone mounted read-only); skipped where mount is not allowed."""
    src, mnt = tmp_path / "src", tmp_path / "ro"
    src.mkdir()
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a read-only bind mount needs root and mount")
    ok = subprocess.run(["mount", "--bind", str(src), str(mnt)], capture_output=True).returncode == 0 and \
        subprocess.run(["mount", "-o", "remount,bind,ro", str(mnt)], capture_output=True).returncode == 0
    if not ok:
        subprocess.run(["umount", str(mnt)], capture_output=True)
        pytest.skip("mount --bind is not permitted here")
    yield mnt
    subprocess.run(["umount", str(mnt)], capture_output=True)


def test_a_read_only_folder_is_refused_in_one_line(read_only, capsys):
    assert cli.main(["run", "01", "-o", str(read_only / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"companion: error: cannot write into {read_only / 'runs'} (Read-only file system); "
                   "give a writable folder for the run with -o DIR")
    assert cli.main(["build", "-o", str(read_only)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"companion: error: cannot write into {read_only / '_build'} (Read-only file system); "
                          "build the book elsewhere with companion build -o DIR (make book BUILD=DIR)")


def test_an_unwritable_folder_is_refused_before_anything_runs(tmp_path, monkeypatch):
    import tempfile

    def refuse(*a, **k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    with pytest.raises(ParameterError, match=r"cannot write into .*out \(Read-only file system\); give a writable"):
        cli.run_chapter("01", {}, tmp_path / "out")


# -- 7. the small ones -------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["yes", "no", "on", "off", "y", "n", "Yes"])
def test_booleans_are_only_true_and_false(text):
    with pytest.raises(ParameterError, match=rf"parameter minilm_noisy='{text}' must be a bool, one of True, False "
                       r"\(default False\); pass true or false"):
        cli.check_parameters("05", {"minilm_noisy": cli._parse_value(text)})
    for good, value in (("true", True), ("false", False), ("True", True), ("FALSE", False)):
        assert cli.check_parameters("05", {"minilm_noisy": cli._parse_value(good)}) == {"minilm_noisy": value}


def test_a_parameter_file_has_the_same_booleans(tmp_path):
    (tmp_path / "p.yaml").write_text("minilm_noisy: on\nseed: 3\n")
    assert cli._read_parameter_file(tmp_path / "p.yaml") == {"minilm_noisy": "on", "seed": 3}


@pytest.mark.parametrize("given, ok", [
    ({"H_values": [2, 4, 8]}, True), ({"H_values": [3]}, False), ({"H_values": [8], "d_values": [8, 16]}, True),
    ({"H_values": [8], "d_values": [8, 12]}, False), ({"H_values": [1]}, True), ({"H_values": [2], "d_values": [9]}, False),
])
def test_chapter_06_checks_that_each_head_count_divides_every_d(given, ok):
    if ok:
        cli.check_parameters("06", given)
    else:
        with pytest.raises(ParameterError, match=r"parameter H_values=.* each a divisor of every d_values with d_values="):
            cli.check_parameters("06", given)


@pytest.mark.parametrize("spec, inside, outside", [
    ("a divisor of d", 4, 3), ("a divisor of 2 * d", 16, 5), ("each a divisor of every ds", [1, 4], [8]),
])
def test_the_divisor_constraint_just_inside_and_outside(spec, inside, outside):
    decl = parameters.declared(f"d = 8  # d; must be in [1, 64]\nds = [8, 12]  # ds; must be non-empty\n"
                               f"x = {inside!r}  # x; must be {spec}\n")
    parameters.check(decl, {"x": inside})
    with pytest.raises(ParameterError, match=r"^parameter x="):
        parameters.check(decl, {"x": outside})
    with pytest.raises(ParameterError, match=r"^parameter x="):
        parameters.check(decl, {"x": [0] if isinstance(inside, list) else 0})


def test_list_into_a_closed_pipe_is_quiet():
    proc = subprocess.Popen([str(Path(sys.executable).with_name("companion")), "list"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT)
    proc.stdout.close()                # the reader has gone, as after `| head -3`
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and err == "", err


def test_the_missing_weights_hint_names_the_interpreter_and_the_file(tmp_path):
    from companion import pretrained

    missing = tmp_path / "minilm.npz"
    with pytest.raises(InvalidInputError) as info:
        pretrained.load_weights(missing)
    message = str(info.value)
    assert str(missing) in message
    command = message.split("run `", 1)[1].split("`", 1)[0]
    exe = Path(command.removesuffix(" -m companion.pretrained fetch"))
    assert command.endswith(" -m companion.pretrained fetch") and str(exe) != "python"
    assert (exe if exe.is_absolute() else ROOT / exe).resolve() == Path(sys.executable).resolve()


def test_make_says_so_when_PYTHON_differs_from_the_venv(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    shutil.copy2(ROOT / "Makefile", tmp_path)
    shutil.copy2(ROOT / "pyproject.toml", tmp_path)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").symlink_to(sys.executable)
    (tmp_path / ".venv" / ".installed").touch()
    other = tmp_path / "python3.99"
    other.write_text("#!/bin/sh\necho 3.99\n")
    other.chmod(0o755)
    have = "%d.%d" % sys.version_info[:2]
    proc = subprocess.run(["make", "venv", f"PYTHON={other}"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode != 0
    assert (f"error: .venv has Python {have} but PYTHON={other} is Python 3.99: remove the old environment "
            "(rm -rf .venv) and run make again") in proc.stdout + proc.stderr
    same = subprocess.run(["make", "venv", f"PYTHON={sys.executable}"], cwd=tmp_path, capture_output=True, text=True)
    assert same.returncode == 0, same.stdout + same.stderr
    assert subprocess.run(["make", "venv"], cwd=tmp_path, capture_output=True).returncode == 0


# -- 2, 4 and the rest: one reader's run of chapter 02 under MPLBACKEND=Agg, then interrupted runs ----

@pytest.fixture(scope="module")
def agg_run(tmp_path_factory):
    """``companion run 02 -p seed 3 --html`` with MPLBACKEND=Agg, as a subprocess (its stderr as a reader sees it)."""
    out = tmp_path_factory.mktemp("agg-run")
    env = dict(os.environ, MPLBACKEND="Agg", OPENBLAS_NUM_THREADS="1")
    env.pop("COMPANION_RESULTS_DIR", None)
    proc = subprocess.run([str(Path(sys.executable).with_name("companion")), "run", "02", "-p", "seed", "3",
                           "-o", str(out), "--no-progress", "--html"], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


@pytest.mark.slow
def test_a_run_under_agg_keeps_its_figures_and_writes_one_pair(agg_run):
    out, proc = agg_run
    assert "without encryption" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["02_exact_learning.ipynb", "02_exact_learning.json",
                                                     "02_exact_learning_html"]
    run = nbformat.read(out / "02_exact_learning.ipynb", as_version=4)
    committed = nbformat.read(CH02, as_version=4)
    assert _png_count(run) == _png_count(committed) == 3
    ref = [c for c in committed.cells if c.cell_type == "code"]
    test = [c for c in run.cells if c.cell_type == "code" and "injected-parameters" not in c.metadata.get("tags", [])]
    assert all(nbcompare.compare_figures(r.outputs, t.outputs) == [] for r, t in zip(ref, test))
    data = json.loads((out / "02_exact_learning.json").read_text())
    assert data["seed"] == 3 and run.metadata.papermill.parameters == {"seed": 3}


@pytest.mark.slow
def test_the_page_of_a_run_shows_its_own_numbers(agg_run):
    from bs4 import BeautifulSoup

    out, proc = agg_run
    page = out / "02_exact_learning_html" / "02_exact_learning.html"
    assert f"page: {page}" in proc.stdout
    run = json.loads((out / "02_exact_learning.json").read_text())["values"]
    book = json.loads((ROOT / "data" / "results" / "02_exact_learning.json").read_text())["values"]
    soup = BeautifulSoup(page.read_text(), "html.parser")
    main = soup.find("main")
    shown = [s.get_text() for s in main.select("span.pasted-text")]
    assert shown and all(t.strip() for t in shown) and "{glue" not in main.get_text()
    cited = _cited(CH02)
    changed = {k: v["text"] for k, v in run.items() if k in cited and k in book and book[k]["text"] != v["text"]}
    assert changed, "seed 3 changed no number the prose cites"
    for name, text in changed.items():
        assert text in shown, f"{name}: the run's {text!r} is not on the page"
    assert "seed = 3" in " ".join(main.select_one("div.admonition").get_text(" ").split())
    # references to other chapters show the book's titles and numbers, not raw labels ("Prerequisites:
    # ch-definitions.", "identity eq-two-token of ch-definitions"), and link to no page of the run's folder
    text = " ".join(main.get_text(" ").split())
    assert "Prerequisites: The model and its oracles ." in text
    assert "through the identity (1.1) of The model and its oracles" in text
    assert not re.search(r"\b(ch|eq|sec|thm)-[a-z]", text), re.search(r".{40}\b(ch|eq|sec|thm)-[a-z].{40}", text)
    local = [a["href"] for a in soup.find_all("a", href=True) if not a["href"].startswith(("http", "#", "mailto"))]
    assert all((page.parent / h.split("#")[0]).exists() for h in local if h.split("#")[0]), local
    imgs = main.find_all("img")
    assert len(imgs) >= 3 and all((page.parent / i["src"]).stat().st_size > 1000 for i in imgs)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Chromium is not installed (make test installs it): the page was checked without a browser")
    import importlib.util

    spec = importlib.util.spec_from_file_location("_browser", ROOT / "tests" / "test_browser.py")
    browser = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(browser)
    dom = BeautifulSoup(browser._render(page, out / "profile", out / "page.png"), "html.parser")
    browser._check_maths(page, dom, dom.find("main") or dom)
    shutil.rmtree(out / "profile", ignore_errors=True)
    (out / "page.png").unlink(missing_ok=True)


def _cited(path) -> set:
    nb = json.loads(path.read_text())
    import re

    md = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    return set(re.findall(r"\{glue(?::\w+)?\}`([^`]+)`", md))


def _interrupt(out, sig, extra=()):
    """Start a seed-9 run into ``out``, send ``sig`` once its kernel runs cells, return (code, stderr)."""
    env = dict(os.environ, MPLBACKEND="Agg", OPENBLAS_NUM_THREADS="1")
    proc = subprocess.Popen([str(Path(sys.executable).with_name("companion")), "run", "02", "-p", "seed", "9",
                             "-o", str(out), "--no-progress", *extra], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    staging = out / "02_exact_learning.running" / "02_exact_learning.ipynb"
    deadline = time.monotonic() + 300

    def ran_a_cell():  # papermill saves the staging notebook after each cell
        try:
            return '"execution_count": 1' in staging.read_text()
        except OSError:
            return False

    # Waiting for the staging notebook alone was not enough on a loaded machine: the signal came
    # before the kernel ran a cell, and the run rightly kept nothing (a fresh-clone run, session 39).
    while not ran_a_cell() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_run_leaves_the_earlier_pair_and_says_what_it_kept(agg_run, sig, code):
    out, _ = agg_run
    before = {n: (out / n).read_bytes() for n in ("02_exact_learning.ipynb", "02_exact_learning.json")}
    rc, err = _interrupt(out, sig, ("--overwrite",))   # without it, the finished run's folder is refused
    assert rc == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"companion: stopped by {signal.Signals(sig).name}; "
                                                   f"02_exact_learning.ipynb and 02_exact_learning.json in {out} "
                                                   "are the earlier run's, unchanged; the incomplete run ("), err
    assert "Traceback" not in err and "ZMQError" not in err
    assert {n: (out / n).read_bytes() for n in before} == before
    incomplete = nbformat.read(out / "02_exact_learning.incomplete.ipynb", as_version=4)
    assert incomplete.metadata.papermill.parameters == {"seed": 9}
    assert sorted(p.name for p in out.iterdir()) == ["02_exact_learning.incomplete.ipynb", "02_exact_learning.ipynb",
                                                     "02_exact_learning.json", "02_exact_learning_html"]
    (out / "02_exact_learning.incomplete.ipynb").unlink()


def background_jobs(items):
    """Chapter 05 without MiniLM heads as a `companion run` in the background pool of conftest.py (it
    overlaps the serial suite); the finished process and its folder."""
    def run_05(run, out):
        env = dict(run.environ, OPENBLAS_NUM_THREADS="1")  # the pool's snapshot (conftest.py), not os.environ
        env.pop("COMPANION_RESULTS_DIR", None)
        return run([str(Path(sys.executable).with_name("companion")), "run", "05", "-p", "minilm_heads", "[]",
                    "-o", str(out), "--no-progress"], env=env, cwd=ROOT, capture_output=True, text=True,
                   timeout=3600), out

    if any(getattr(i, "originalname", "") == "test_a_section_skipped_by_a_parameter_says_so" for i in items):
        yield {"key": ("rerun", "05 without MiniLM heads"), "chapter": "05_robustness", "fn": run_05,
               "kind": "companion run of 05 without MiniLM heads"}


@pytest.mark.slow
def test_a_section_skipped_by_a_parameter_says_so(background):
    """Chapter 05 with minilm_heads: [] prints one sentence, not ``Empty DataFrame``."""
    proc, tmp_path = background[("rerun", "05 without MiniLM heads")].result()
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "05_robustness.ipynb"
    nb = nbformat.read(out, as_version=4)
    cell = next(c for c in nb.cells if c.get("id") == "61e9bbb3")
    text = "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", "")) for o in cell.outputs)
    assert "Empty DataFrame" not in text
    assert text.strip().startswith("Skipped (minilm_heads = []): this run learned no MiniLM head")
    values = json.loads((tmp_path / "05_robustness.json").read_text())["values"]
    assert values["minilm_f16_paper"]["text"] == "n/a (minilm_heads is empty)"


# -- 5. every documented install path -----------------------------------------------------------------

@pytest.mark.slow
def test_pip_install_e_dot_runs_or_refuses_every_documented_command(tmp_path):
    """`pip install -e .` (the Library reference page) in a fresh venv: the library, `companion list`
    and `cite` work; `companion run` and `build` refuse in one line naming the [book] extra. The
    `[book,test]` path (`make venv`) is the environment of this suite."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    # --no-compile: pip writes no .pyc for the installed packages (18 of its 39 CPU s here, measured
    # 2026-12-04); Python compiles what the commands import. What is installed is the same.
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-compile", "-e",
                          str(ROOT)],
                         capture_output=True, text=True, timeout=1800)
    assert pip.returncode == 0, pip.stderr[-3000:]
    companion = str(venv / "bin" / "companion")
    env = {k: v for k, v in os.environ.items() if k not in ("COMPANION_RESULTS_DIR", "PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}:/usr/bin:/bin"

    def run(*argv):
        return subprocess.run([companion, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)

    assert run("list").returncode == 0
    name = sorted(json.loads((ROOT / "data" / "results" / "02_exact_learning.json").read_text())["values"])[0]
    assert run("cite", "02", name).returncode == 0
    for argv, what in ((["run", "01_definitions", "-o", str(tmp_path / "runs")], "companion run"),
                       (["build", "-o", str(tmp_path / "book")], "companion build")):
        proc = run(*argv)
        assert proc.returncode == 2, proc.stderr[-2000:]
        line = proc.stderr.strip()
        assert "\n" not in line and line.startswith(f"companion: error: {what}") and "pip install -e '.[book]'" in line
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    code = ("from companion.attention import random_single_head; from companion.oracles import ValueQueryOracle; "
            "from companion.exact import learn_single_head; t = random_single_head(4, seed=0); "
            "print(learn_single_head(ValueQueryOracle(t)).n_learning_queries)")
    lib = subprocess.run([str(venv / "bin" / "python"), "-c", code], env=env, capture_output=True, text=True)
    assert lib.stdout.strip() == "20", lib.stderr[-2000:]


def test_the_staging_notebook_is_written_atomically(tmp_path, monkeypatch):
    """A fresh-clone run (session 44) kept nothing of an interrupted run: the stop had cut papermill's
    save of the staging notebook mid-write. The child's local handler now writes a temporary file and
    renames it: an interrupted write leaves the last complete save and no temporary file."""
    from papermill.iorw import LocalHandler

    from companion.book._execute import _make_writes_atomic

    handler = LocalHandler()
    _make_writes_atomic(handler)
    path = tmp_path / "run.ipynb"
    handler.write('{"cells": [1]}', str(path))
    assert path.read_text() == '{"cells": [1]}'

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        handler.write('{"cells": [1, 2', str(path))
    assert path.read_text() == '{"cells": [1]}' and [p.name for p in tmp_path.iterdir()] == ["run.ipynb"]
