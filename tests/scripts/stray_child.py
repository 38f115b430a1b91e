"""A worker whose child leaves the worker's session (setsid), ignores SIGTERM and holds the worker's stdout.

  stray_child.py DIR [rank-scope]

Writes the child's pid to DIR/child.<rank>.<restart>. On the first attempt rank 0 crashes (exit 1) once every
rank's child is up. The other ranks then wait to be stopped; with ``rank-scope`` (run under --restart-scope
rank) each child is started through a middle process that exits at once, so it is an orphan while its rank
still runs, and rank 1 waits for rank 0's restart, writes to DIR/scope whether rank 0's first child and its
own are alive at that moment, and exits 0. Later attempts exit 0 at once, leaving their child behind.
"""
import os
import subprocess
import sys
import time

CHILD = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"

out_dir = sys.argv[1]
rank_scope = sys.argv[2:] == ["rank-scope"]
rank, restart = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
record = os.path.join(out_dir, f"child.{rank}.{restart}")
if rank_scope:  # through a short-lived middle process: the child is an orphan while its rank still runs
    middle = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', sys.argv[1]], "
              "start_new_session=True, stderr=subprocess.DEVNULL); open(sys.argv[2] + '.tmp', 'w').write(str(p.pid))")
    subprocess.run([sys.executable, "-c", middle, CHILD, record], stdout=sys.stdout, check=True)
    with open(record + ".tmp") as f:
        child_pid = int(f.read())
    os.rename(record + ".tmp", record)
else:
    child_pid = subprocess.Popen([sys.executable, "-c", CHILD], start_new_session=True, stdout=sys.stdout,
                                 stderr=subprocess.DEVNULL).pid
    with open(record, "w") as f:
        f.write(str(child_pid))
print(f"rank {rank} restart {restart}: child {child_pid}", flush=True)


def wait_for(names, seconds=60.0):
    deadline = time.monotonic() + seconds
    while not all(os.path.exists(os.path.join(out_dir, n)) for n in names) and time.monotonic() < deadline:
        time.sleep(0.05)


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


if restart == 0:
    world = int(os.environ["WORLD_SIZE"])
    if rank == 0:  # crash once every rank's child is up
        wait_for([f"child.{r}.0" for r in range(world)])
        sys.exit(1)
    if not rank_scope:
        time.sleep(120)
    wait_for(["child.0.1"])
    with open(os.path.join(out_dir, "child.0.0")) as f:
        first = int(f.read())
    with open(os.path.join(out_dir, "scope"), "w") as f:
        f.write(f"rank0-first-child-alive={alive(first)} own-child-alive={alive(child_pid)}")
