"""The process that executes one chapter for ``companion run`` (private; see :func:`companion.book.cli.run_chapter`).

``python -m companion.book._execute SPEC.json`` reads what to run from ``SPEC.json`` (input and output
notebook, parameters, working folder, time limit per cell, progress bar), executes it with
papermill into the staging folder the spec names, and writes ``{"ok": true}`` or the error
(``ename``, ``evalue``, ``exec_count``, ``timeout``) to the spec's ``status`` file. It prints no
traceback: the executed notebook holds it. ``companion run`` starts it in a session of its own, so
that a Ctrl-C in the terminal reaches ``companion run`` alone, which then stops this process
(SIGTERM: it ends its kernel and exits at once; papermill has saved the notebook after every
finished cell).

The kernel talks to papermill over IPC sockets in the private folder ``runtime`` of the spec
(``JUPYTER_RUNTIME_DIR``), not over TCP: no other user of the machine can connect to it, and
ipykernel does not warn that the TCP connection is unencrypted.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path


def _status(spec: dict, data: dict) -> None:
    Path(spec["status"]).write_text(json.dumps(data), encoding="utf-8")


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    from jupyter_client.manager import AsyncKernelManager
    from traitlets.config import Config

    config = Config({"KernelManager": {"transport": "ipc", "ip": str(Path(spec["runtime"]) / "kernel")}})
    km = AsyncKernelManager(kernel_name="python3", config=config)

    def end_kernel():
        # the kernel runs in a process group of its own: end it with us, before it can print
        # that its parent is gone (after a time limit nbclient may leave it running)
        process = getattr(km.provisioner, "process", None)
        if process is not None and process.poll() is None:
            try:
                os.killpg(getattr(km.provisioner, "pgid", None) or process.pid, signal.SIGKILL)
            except OSError:
                pass

    def stop(*_):
        end_kernel()  # papermill has saved the notebook after every finished cell
        os._exit(143)

    signal.signal(signal.SIGTERM, stop)
    try:
        return _run(spec, km)
    finally:
        end_kernel()


def _make_writes_atomic(handler) -> None:
    """Make papermill's local I/O ``handler`` write atomically: the notebook goes to a temporary file in
    its folder, then is renamed over it, so that a run stopped while papermill saves it (``stop`` above
    exits at once) keeps the last complete save. A fresh-clone run kept nothing: the stop had cut the
    staging notebook mid-write, and ``companion run`` could not read it (session 44). (papermill's
    ``register`` cannot replace its local handler: ``get_handler`` takes the first one registered.)"""
    import types

    from papermill.utils import chdir

    from .._atomic import write_atomic

    def write(self, buf, path):
        with chdir(self._cwd):
            folder = os.path.dirname(path) or "."
            if not os.path.isdir(folder):
                raise FileNotFoundError(f"output folder {folder} doesn't exist.")
            write_atomic(path, buf, fsync=False)  # a stopped process, not a lost disk: no fsync per cell

    handler.write = types.MethodType(write, handler)


def _run(spec: dict, km) -> int:
    import logging

    import papermill
    from papermill.iorw import papermill_io

    # nbclient logs through papermill's logger ("Timeout waiting for execute reply"): the one line
    # of companion run says it, from the status written below
    logging.getLogger("papermill").addHandler(logging.NullHandler())
    _make_writes_atomic(papermill_io.get_handler(spec["output"]))

    try:
        papermill.execute_notebook(
            spec["input"],
            spec["output"],
            parameters=spec["parameters"],
            cwd=spec["cwd"],
            progress_bar=spec["progress_bar"],
            kernel_name="python3",
            execution_timeout=spec["timeout"],
            km=km,
        )
    except papermill.PapermillExecutionError as exc:
        timeout = exc.ename in ("CellTimeoutError", "TimeoutError") or "timed out" in str(exc.evalue).lower()
        _status(
            spec,
            {
                "ok": False,
                "ename": exc.ename,
                "evalue": str(exc.evalue).strip(),
                "exec_count": exc.exec_count,
                "timeout": timeout,
            },
        )
        return 1
    except Exception as exc:  # nbclient's CellTimeoutError, DeadKernelError, NoSuchKernel
        name = type(exc).__name__
        _status(
            spec,
            {
                "ok": False,
                "ename": name,
                "evalue": str(exc).strip().splitlines()[0] if str(exc).strip() else "",
                "exec_count": None,
                "timeout": name in ("CellTimeoutError", "TimeoutError"),
            },
        )
        return 1
    _status(spec, {"ok": True})
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1]))
