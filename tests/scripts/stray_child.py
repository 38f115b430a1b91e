"""A worker whose child leaves the worker's session (setsid), ignores SIGTERM and holds the worker's stdout.

Writes the child's pid to DIR/child.<rank>.<restart>. On the first attempt rank 0 crashes (exit 1) once every
rank's child is up, and the others wait to be stopped; on later attempts every rank exits 0 at once, leaving
its child behind.
"""
import os
import subprocess
import sys
import time

CHILD = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"

out_dir = sys.argv[1]
rank, restart = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
child = subprocess.Popen([sys.executable, "-c", CHILD], start_new_session=True, stdout=sys.stdout,
                         stderr=subprocess.DEVNULL)
with open(os.path.join(out_dir, f"child.{rank}.{restart}"), "w") as f:
    f.write(str(child.pid))
print(f"rank {rank} restart {restart}: child {child.pid}", flush=True)
if restart == 0:
    if rank == 0:  # crash once every rank's child is up
        world = int(os.environ["WORLD_SIZE"])
        deadline = time.monotonic() + 60
        while len([n for n in os.listdir(out_dir) if n.endswith(".0")]) < world and time.monotonic() < deadline:
            time.sleep(0.05)
        sys.exit(1)
    time.sleep(120)
