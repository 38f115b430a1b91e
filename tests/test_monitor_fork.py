"""The rank monitor forked from the launcher (link.fork_monitor): what its process looks like, how it ends, and
that a threaded process is not forked. Each case runs in its own interpreter: pytest's process is not forked."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from testkit.helpers import REPO

pytestmark = pytest.mark.processes


def _run(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(90)
def test_the_forked_monitor_is_named_serves_and_ends_on_eof() -> None:
    seen = _run("""
        import json, os, time
        from mbr_launch.monitor.link import fork_monitor
        child = fork_monitor()
        # The child names itself once it runs: on a loaded machine that may take a while.
        end = time.monotonic() + 30
        while time.monotonic() < end:
            with open(f"/proc/{child.pid}/comm") as f:
                if f.read().strip() == "mbr-monitor":
                    break
            time.sleep(0.05)
        with open(f"/proc/{child.pid}/cmdline", "rb") as f:
            title = f.read().split(b"\\0")[0].decode()
        with open(f"/proc/{child.pid}/comm") as f:
            name = f.read().strip()
        session = os.getsid(child.pid) == child.pid
        alive = child.poll() is None
        # A command it does not know gets an error event back: it reads our commands and answers on its stdout.
        child.stdin.write(b'{"op": "nonsense"}\\n'); child.stdin.flush()
        reply = json.loads(child.stdout.readline())
        child.stdin.close()  # the launcher is gone: the monitor ends on its own
        code = child.wait(10)
        print(json.dumps({"title": title, "name": name, "session": session, "alive": alive, "me": os.getpid(),
                          "reply": reply.get("ev"), "code": code}))
    """)
    assert seen["title"] == f"mbr_launch.monitor.server: rank monitor of mbr-launch {seen['me']}", seen
    assert seen["name"] == "mbr-monitor" and seen["session"] and seen["alive"], seen
    assert seen["reply"] == "error" and seen["code"] == 0, seen


@pytest.mark.timeout(60)
def test_a_threaded_process_is_not_forked_and_the_link_starts_an_interpreter() -> None:
    seen = _run("""
        import json, threading, time
        from mbr_launch.monitor.link import fork_monitor
        from mbr_launch.monitor.link import MonitorLink
        stop = threading.Event()
        threading.Thread(target=stop.wait, daemon=True).start()
        refused = fork_monitor() is None
        link = MonitorLink().spawn(fork=True)
        kind = type(link._proc).__name__
        # Popen returns once the child's execve has released its vfork parent, which is before the kernel
        # has set up the new program's arguments: read until they are there.
        argv, end = [b""], time.monotonic() + 10
        while argv == [b""] and time.monotonic() < end:
            with open(f"/proc/{link.pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\\0")
            time.sleep(0.01)
        link.close()
        stop.set()
        print(json.dumps({"refused": refused, "kind": kind, "module": b"mbr_launch.monitor.server" in argv}))
    """)
    assert seen == {"refused": True, "kind": "Popen", "module": True}, seen


@pytest.mark.timeout(60)
def test_wait_times_out_and_kill_reports_the_signal() -> None:
    seen = _run("""
        import json, subprocess
        from mbr_launch.monitor.link import fork_monitor
        child = fork_monitor()
        try:
            child.wait(0.2)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        child.kill()
        print(json.dumps({"timed_out": timed_out, "code": child.wait(10), "again": child.poll()}))
    """)
    assert seen == {"timed_out": True, "code": -9, "again": -9}, seen
