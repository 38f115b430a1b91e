"""A worker for the health-check and leftover tests (standard library only).

  health_worker.py OUT_DIR [--remove PATH] [--leave-child]

On the first attempt rank 0 removes PATH (another node's storage health-check path, so that node fails its
check before the restart), with --leave-child first starts a process that survives the stop (it leaves the
worker's session, ignores SIGTERM, and replaces its environment, so nothing names it a worker's; its pid goes
to OUT_DIR/child), then exits 1; the other ranks wait to be stopped. Later attempts write
"RANK WORLD_SIZE CPUS MEMPOLICY" (the CPUs it may run on, its memory policy's mode: 0 default, 2 bind, 4 local,
? unknown) to OUT_DIR/done.RANK and exit 0.
"""
import ctypes
import platform
import os
import subprocess
import sys
import time

out_dir = sys.argv[1]
remove = sys.argv[sys.argv.index("--remove") + 1] if "--remove" in sys.argv else None
rank, restart = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])

if restart == 0:
    if rank != 0:
        time.sleep(60)  # stopped by the launcher when rank 0 fails
        sys.exit(0)
    if "--leave-child" in sys.argv:
        # Through a middle process that exits at once: the child is orphaned (the launcher, as subreaper,
        # adopts it) and its environment no longer carries the run's id. It keeps the test session's marker
        # so that the test suite's leftover check would see it if the test did not kill it.
        middle = ("import os, subprocess, sys; p = subprocess.Popen(['sh', '-c', 'trap \"\" TERM; exec sleep 60'], "
                  "start_new_session=True, env={'PATH': os.environ['PATH'], 'MBR_TEST_SESSION': "
                  "os.environ.get('MBR_TEST_SESSION', '')}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
                  "print(p.pid)")
        pid = subprocess.run([sys.executable, "-c", middle], capture_output=True, text=True, check=True).stdout
        with open(os.path.join(out_dir, "child"), "w") as f:
            f.write(pid.strip())
    if remove:
        os.remove(remove)
    sys.exit(1)


def mempolicy() -> str:
    number = {"x86_64": 239, "aarch64": 236}.get(platform.machine())  # get_mempolicy(2)
    if number is None:
        return "?"
    mode = ctypes.c_int(0)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, ctypes.byref(mode), None, ctypes.c_ulong(0), None, ctypes.c_ulong(0)) != 0:
        return "?"
    return str(mode.value)


cpus = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
with open(os.path.join(out_dir, f"done.{rank}"), "w") as f:
    f.write(f"{rank} {os.environ['WORLD_SIZE']} {cpus} {mempolicy()}\n")
