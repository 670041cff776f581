"""A build's start-up imports what it uses: the command's process imports no hub client and no fsspec
until a source asks for the hub or a data_files pattern, and the fork server imports the workers'
modules once (pipeline/encode/fork_server.py ``import_worker``) without pyarrow, whose allocator
starts a thread the server must not fork with (a batch of Arrow columns imports it where it is used)."""

from __future__ import annotations

import subprocess
import sys


def imported(code: str) -> list[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()


def test_the_build_command_imports_no_hub_client_nor_fsspec():
    code = ("import sys, packtrain.cli.commands, packtrain.pipeline.orchestrate.build\n"
            "print(*sorted(m for m in ('huggingface_hub', 'fsspec', 'packtrain.pipeline.orchestrate.build') "
            "if m in sys.modules))\n")
    assert imported(code) == ["packtrain.pipeline.orchestrate.build"]


def test_the_fork_server_imports_the_workers_modules_without_pyarrow_or_its_thread():
    code = ("import os, sys\n"
            "from packtrain.pipeline.encode import fork_server\n"
            "fork_server.import_worker()\n"
            "print(*sorted(m for m in ('packtrain.pipeline.encode.pool', 'packtrain.pipeline.encode.worker', "
            "'jinja2.sandbox', 'pyarrow') if m in sys.modules))\n"
            "print(*sorted({open(f'/proc/self/task/{t}/comm').read().strip() for t in os.listdir('/proc/self/task')}))\n"
            "import time, pyarrow\n"
            "pyarrow.array([1])\n"  # the positive control: pyarrow's allocator starts its thread, on a loaded machine
            "for _ in range(600):\n"  # a moment later (the check above needs no wait: the thread is never started)
            "    names = {open(f'/proc/self/task/{t}/comm').read().strip() for t in os.listdir('/proc/self/task')}\n"
            "    if 'jemalloc_bg_thd' in names: break\n"
            "    time.sleep(0.05)\n"
            "print(*sorted(names))\n")
    modules, threads, with_pyarrow = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                                    check=True).stdout.splitlines()
    assert modules.split() == ["jinja2.sandbox", "packtrain.pipeline.encode.pool", "packtrain.pipeline.encode.worker"]
    assert "jemalloc_bg_thd" not in threads.split() and "jemalloc_bg_thd" in with_pyarrow.split()


def test_make_install_compiles_packtrains_own_bytecode():
    """An editable install has no bytecode of packtrain's own modules: where PYTHONDONTWRITEBYTECODE is set,
    every process (a build's, its fork server, a trainer's) compiled them again on import. `make install`
    compiles them (what changed since), as uv does the dependencies'."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    dry = subprocess.run(["make", "-n", "-s", "install"], cwd=root, capture_output=True, text=True, check=True).stdout
    compiles = [line.split() for line in dry.splitlines() if "-m compileall" in line]
    assert compiles and {"pipeline", "trainer", "packtrain"} <= set(compiles[-1])
