"""The fork server (``workers.forkserver``, ``shim.forkchild``): a worker forked from a copy of the launcher
that imported torch must be the worker a fresh ``python -u -m mbr_launch.shim.boot SCRIPT`` would be.

Each script below runs twice in one driver process: forked from a real fork server (the driver imports torch
with TORCH_CPP_LOG_LEVEL=ERROR and SIGTERM handled, as a launcher does) and as a fresh interpreter; the exit
status, the output and what the script saw of itself must be the same. Then real launches: the forked path is
the default one, a restart forks a warm replacement, and a SIGKILLed launcher leaves no worker behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mbr_launch.workers import forkserver
from testkit.helpers import launcher_env, run_events, run_launcher, start_launcher

pytestmark = [pytest.mark.timeout(600), pytest.mark.processes]  # a loaded machine: a fresh `import torch` alone took over 60 s at load 45

SCRIPTS = {
    "exit3": "import sys; print('out'); sys.exit(3)",
    "exit_message": "import sys; sys.exit('bye from the script')",
    "raises": "def f():\n    raise ValueError('boom')\nf()",
    "interrupt": "raise KeyboardInterrupt",
    "killed": "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
    "at_exit": textwrap.dedent("""\
        import atexit, os, sys, threading, time
        atexit.register(lambda: print('atexit ran', flush=True))
        unclosed = open(os.environ['UNCLOSED'], 'w')
        unclosed.write('written, never closed or flushed')
        threading.Thread(target=lambda: (time.sleep(0.3), print('thread finished'))).start()
        print('main returns')
        """),
    "collect": textwrap.dedent("""\
        import atexit, gc
        import torch.distributed  # boot's exit handler collects only where it is loaded
        def watch_the_collection():  # registered after boot's handler, so it runs before it
            real = gc.collect
            gc.collect = lambda *args: (print('collected at exit', flush=True), real(*args))[1]
        atexit.register(watch_the_collection)
        """),
    "state": textwrap.dedent("""\
        import ctypes, gc, json, os, signal, sys
        fds = sorted(int(fd) for fd in os.listdir('/proc/self/fd'))
        import torch, numpy
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), 'lib', 'libc10.so'))
        def disposition(sig):
            h = signal.getsignal(sig)
            return h if isinstance(h, int) else getattr(h, '__name__', repr(h))
        with open('/proc/self/status') as f:
            status = dict(line.rstrip('\\n').split(':\\t', 1) for line in f if ':\\t' in line)
        print(json.dumps({
            'argv': sys.argv, 'orig_argv': sys.orig_argv, 'name': __name__, 'path0': sys.path[0],
            'cwd': os.getcwd(), 'env': dict(os.environ), 'fds': fds[:3], 'more_fds': len(fds) > 4,
            'stdin': os.readlink('/proc/self/fd/0'), 'gc': gc.isenabled(),
            'cpp_log_level': ctypes.c_int.in_dll(lib, 'FLAGS_caffe2_log_level').value,
            'threads': torch.get_num_threads(), 'signals': {s.name: disposition(s) for s in
                (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGUSR1, signal.SIGHUP)},
            'blocked': status['SigBlk'], 'session_leader': os.getsid(0) == os.getpid(),
            'unbuffered': sys.stdout.write_through, 'encoding': sys.stdout.encoding,
            'numpy_draw': int(numpy.random.randint(1 << 30)),
            'cmdline': open('/proc/self/cmdline', 'rb').read().replace(b'\\0', b' ').decode().strip(),
        }))
        """),
}

DRIVER = textwrap.dedent("""\
    import json, os, signal, subprocess, sys
    os.environ['TORCH_CPP_LOG_LEVEL'] = 'ERROR'  # the launcher's own, not the workers'
    signal.signal(signal.SIGTERM, lambda *a: None)  # a handler of the launcher's: never the worker's
    import torch
    from mbr_launch.workers.forkserver import ForkServer
    cases, env, cwd = json.loads(sys.stdin.read())
    server = ForkServer.start()
    assert server is not None, 'no fork server'
    out = {}
    for name, script in cases.items():
        argv = [sys.executable, '-u', '-m', 'mbr_launch.shim.boot', script]
        proc = server.spawn(argv, env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        stdout, stderr = proc.stdout.read(), proc.stderr.read()
        out[name] = [proc.wait(300), stdout.decode(), stderr.decode(), os.getpid()]
    server.close()
    print(json.dumps(out))
    """)


def _fresh(argv: list[str], env: dict[str, str], cwd: str) -> list:
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, timeout=300, stdin=subprocess.DEVNULL,
                          start_new_session=True)
    return [done.returncode, done.stdout.decode(), done.stderr.decode()]


@pytest.fixture(scope="module")
def both_ways(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list, list]]:
    tmp = tmp_path_factory.mktemp("forkserver")
    paths = {}
    for name, text in SCRIPTS.items():
        paths[name] = str(tmp / f"{name}.py")
        Path(paths[name]).write_text(text)
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_CPP_LOG_LEVEL", "PYTHONWARNINGS")}
    env.update(UNCLOSED=str(tmp / "unclosed.txt"), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore::FutureWarning")
    driver_env = {**env, "UNCLOSED": str(tmp / "unclosed-forked.txt")}
    forked = subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps([paths, driver_env, str(tmp)]),
                            capture_output=True, text=True, timeout=400, env=env, cwd=str(tmp))
    assert forked.returncode == 0, forked.stderr
    forked_results = json.loads(forked.stdout)
    results = {}
    for name, path in paths.items():
        fresh = _fresh([sys.executable, "-u", "-m", "mbr_launch.shim.boot", path], env, str(tmp))
        results[name] = (forked_results[name], fresh)
    results["_files"] = ((tmp / "unclosed-forked.txt").read_text(), (tmp / "unclosed.txt").read_text())  # type: ignore[assignment]
    return results


@pytest.mark.parametrize("name", ["exit3", "exit_message", "raises", "interrupt", "killed", "at_exit"])
def test_a_forked_worker_ends_as_a_fresh_interpreter_does(both_ways, name):
    (code, out, err, _driver), (fresh_code, fresh_out, fresh_err) = both_ways[name]
    assert code == fresh_code, (err, fresh_err)
    assert out == fresh_out
    assert err.replace("\r", "") == fresh_err.replace("\r", "")
    expected = {"exit3": 3, "exit_message": 1, "raises": 1, "interrupt": -signal.SIGINT, "killed": -signal.SIGKILL,
                "at_exit": 0}
    assert code == expected[name]


def test_buffers_and_threads_are_finished_at_exit_as_in_a_fresh_interpreter(both_ways):
    forked_file, fresh_file = both_ways["_files"]
    assert forked_file == fresh_file == "written, never closed or flushed"
    (_, out, _, _), _ = both_ways["at_exit"]
    assert out.splitlines() == ["main returns", "thread finished", "atexit ran"]


def test_a_forked_worker_does_not_collect_at_exit_what_it_never_finalizes(both_ways):
    # A fresh interpreter collects a destroyed process group before Py_Finalize, which could crash in its
    # destructor; a forked worker ends with os._exit and never runs it: collecting there only risked gloo's
    # threads waiting for the GIL while the destructor joined them (a rank that never exited, 1 in ~50 launches).
    (code, out, err, _driver), (fresh_code, fresh_out, fresh_err) = both_ways["collect"]
    assert code == fresh_code == 0, (err, fresh_err)
    assert fresh_out == "collected at exit\n" and out == "", (out, fresh_out)


def test_a_forked_worker_sees_itself_as_a_fresh_interpreter_does(both_ways):
    (code, out, err, driver), (fresh_code, fresh_out, fresh_err) = both_ways["state"]
    assert code == fresh_code == 0, (err, fresh_err)
    forked, fresh = json.loads(out), json.loads(fresh_out)
    assert forked["env"].pop("UNCLOSED") != fresh["env"].pop("UNCLOSED")  # the driver gave each its own file
    assert forked.pop("numpy_draw") != fresh.pop("numpy_draw")  # seeded afresh, not the driver's state copied
    # The forked one was the fork server's child (the driver's grandchild), not a new interpreter.
    assert forked == fresh
    assert forked["cpp_log_level"] == 1  # WARNING, not the driver's ERROR
    assert forked["signals"]["SIGTERM"] == signal.SIG_DFL and forked["signals"]["SIGPIPE"] == signal.SIG_IGN
    assert "TORCH_CPP_LOG_LEVEL" not in forked["env"] and forked["stdin"] == "/dev/null"
    assert driver > 0


def test_numpy_draws_differ_between_forked_workers(tmp_path):
    script = tmp_path / "draw.py"
    script.write_text("import numpy; print(numpy.random.randint(1 << 30))")
    driver = DRIVER
    env = {**os.environ, "PYTHONWARNINGS": "ignore::FutureWarning"}
    env.pop("TORCH_CPP_LOG_LEVEL", None)
    done = subprocess.run([sys.executable, "-c", driver],
                          input=json.dumps([{"a": str(script), "b": str(script)}, env, str(tmp_path)]),
                          capture_output=True, text=True, timeout=400, env=env)
    assert done.returncode == 0, done.stderr
    draws = json.loads(done.stdout)
    assert draws["a"][0] == draws["b"][0] == 0
    assert draws["a"][1] != draws["b"][1]


def test_which_variables_keep_a_worker_from_being_forked():
    launcher = {"PATH": "/bin", "OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR", "RES_OPTIONS": "x"}
    assert forkserver.differences(launcher, {"PATH": "/bin", "OMP_NUM_THREADS": "1", "RANK": "3",
                                             "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCHELASTIC_RUN_ID": "r",
                                             "CUDA_VISIBLE_DEVICES": "2"}) == []
    assert forkserver.differences(launcher, {"OMP_NUM_THREADS": "4"}) == ["OMP_NUM_THREADS"]
    assert forkserver.differences(launcher, {**launcher, "PYTHONPATH": "/x", "MKL_NUM_THREADS": "2",
                                             "LD_PRELOAD": "y"}) == ["LD_PRELOAD", "MKL_NUM_THREADS", "PYTHONPATH"]
    assert forkserver.forkable([sys.executable, "-u", "-m", "mbr_launch.shim.boot", "train.py"])
    assert not forkserver.forkable([sys.executable, "-u", "train.py"])
    assert not forkserver.forkable(["numactl", "--cpunodebind=0", sys.executable, "-u", "-m",
                                    "mbr_launch.shim.boot", "train.py"])


RESTARTING = textwrap.dedent("""\
    import os, sys, time
    out = os.environ['PROBE_DIR']
    count = os.environ['TORCHELASTIC_RESTART_COUNT']
    parent = open(f'/proc/{os.getppid()}/comm').read().strip()
    with open(os.path.join(out, f"{os.environ['RANK']}.{count}"), 'w') as f:
        f.write(f"{parent} {'torch' in sys.modules}")
    if count == '0' and os.environ['RANK'] == '1':
        sys.exit(7)
    import torch  # a script that may need torch: the default standby level forks it with torch imported
    """)


def test_launch_and_restart_fork_warm_workers_from_the_server(tmp_path, port):
    script = tmp_path / "restarting.py"
    script.write_text(RESTARTING)
    env = {**launcher_env(), "PROBE_DIR": str(tmp_path)}
    done = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--log-dir",
                         str(tmp_path / "logs"), str(script)], env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    seen = {p.name: p.read_text() for p in tmp_path.iterdir() if p.name[0].isdigit()}
    assert seen == {name: "mbr-forkserver True" for name in ("0.0", "1.0", "0.1", "1.1")}
    starts = [e for e in run_events(tmp_path / "logs") if e["event"] == "worker_start"]
    assert len(starts) == 4 and all(e["standby_state"] == "warm" for e in starts), starts
    failure = [e for e in run_events(tmp_path / "logs") if e["event"] == "worker_exit" and e.get("exit_code") == 7]
    assert failure, "the forked rank's exit code 7 must be recorded"


def test_a_killed_launcher_takes_its_forked_workers_down(tmp_path, port):
    script = tmp_path / "sleeper.py"
    script.write_text("import os, time, torch\nopen(os.environ['PROBE_DIR'] + f\"/{os.getpid()}\", 'w').close()\n"
                      "time.sleep(600)\n")
    env = {**launcher_env(), "PROBE_DIR": str(tmp_path)}
    proc = start_launcher(["--standalone", "--nproc-per-node", "2", "--log-dir", str(tmp_path / "logs"),
                           str(script)], env=env)
    try:
        deadline = time.monotonic() + 120
        while len([p for p in tmp_path.iterdir() if p.name.isdigit()]) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        pids = [int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()]
        assert len(pids) == 2
        proc.kill()  # the launcher alone: the workers and the fork server are in sessions of their own
        proc.wait(30)
        deadline = time.monotonic() + 20
        while _alive(pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pids)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.append(pid)
    return alive


CUDA_PROBE = textwrap.dedent("""\
    import os, sys, torch
    count = os.environ['TORCHELASTIC_RESTART_COUNT']
    x = torch.ones(1 << 20, device='cuda')
    with open(os.path.join(os.environ['PROBE_DIR'], f'cuda.{count}'), 'w') as f:
        f.write(f"{open(f'/proc/{os.getppid()}/comm').read().strip()} {torch.cuda.current_device()} {float(x.sum())}")
    if count == '0':
        os._exit(9)
    """)


@pytest.mark.skipif(not os.path.exists("/dev/nvidiactl"), reason="needs a GPU")
def test_standby_cuda_forks_workers_that_make_their_own_cuda_context(tmp_path, port):
    # The server never initialises CUDA (a forked child could not); each forked standby makes its own context.
    script = tmp_path / "cuda_probe.py"
    script.write_text(CUDA_PROBE)
    env = {**launcher_env(), "PROBE_DIR": str(tmp_path)}
    done = run_launcher(["--standalone", "--nproc-per-node", "1", "--standby", "cuda", "--max-restarts", "1",
                         "--log-dir", str(tmp_path / "logs"), str(script)], env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    seen = {p.name: p.read_text() for p in tmp_path.iterdir() if p.name.startswith("cuda.")}
    assert seen == {"cuda.0": "mbr-forkserver 0 1048576.0", "cuda.1": "mbr-forkserver 0 1048576.0"}, seen



PRELOADED = textwrap.dedent("""\
    import os, sys
    out, count, rank = os.environ['PROBE_DIR'], os.environ['TORCHELASTIC_RESTART_COUNT'], os.environ['RANK']
    had_dynamo = 'torch._dynamo' in sys.modules  # before any import of the script's own
    if count == '1':
        os.environ['TORCHDYNAMO_VERBOSE'] = '1'  # read when torch._dynamo is imported: too late for a standby's
    import torch
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)  # imports torch._dynamo
    with open(os.path.join(out, f'{rank}.{count}'), 'w') as f:
        f.write(f"{open(f'/proc/{os.getppid()}/comm').read().strip()} {had_dynamo}")
    if count == '0' and rank == '1':
        sys.exit(7)
    """)


def test_the_fork_server_imports_the_preload_once_for_every_worker(tmp_path, port):
    # torch._dynamo (the default --standby-preload; a script's optimizer imports it) is imported by the fork
    # server before its first fork, so neither the first round's workers nor a restart's import it again; what
    # its import read is still watched: a script that sets one of those variables is told, once per rank.
    script = tmp_path / "preloaded.py"
    script.write_text(PRELOADED)
    env = {**launcher_env(), "PROBE_DIR": str(tmp_path)}
    done = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--log-dir",
                         str(tmp_path / "logs"), str(script)], env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    seen = {p.name: p.read_text() for p in tmp_path.iterdir() if p.name[0].isdigit()}
    assert seen == {name: "mbr-forkserver True" for name in ("0.0", "1.0", "0.1", "1.1")}, seen
    assert done.stderr.count("TORCHDYNAMO_VERBOSE, set by the script, may have no effect") == 2, done.stderr
    assert done.stderr.count("warm standby") == 2, done.stderr  # one line per rank, naming torch._dynamo
    done = run_launcher(["--standalone", "--nproc-per-node", "1", "--standby-preload", "none", "--log-dir",
                         str(tmp_path / "logs2"), str(script)], env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "0.0").read_text() == "mbr-forkserver False"
