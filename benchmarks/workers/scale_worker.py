"""Scale-bench worker: no torch, no collective; measures the launchers' own rendezvous and restart round.

Appends ``ready <rank> <generation> <time> <pid>`` to ``--ready-file`` as soon as it runs (the launcher has
finished the rendezvous and started it). Generation 0 (``--restarted-file`` absent: the first round) then
sleeps up to ``--hold`` seconds: the harness kills one rank meanwhile, and the other agents must learn of it
through the rendezvous, since the workers do not talk to each other. Generation 1 (the harness created
``--restarted-file`` just before the kill) exits 0 at once. A file rather than TORCHELASTIC_RESTART_COUNT:
torchrun counts restarts per agent, so the agents that restart for a peer's failure start their workers
with count 0 again.
"""

import argparse
import os
import time

p = argparse.ArgumentParser()
p.add_argument("--ready-file", required=True)
p.add_argument("--restarted-file", required=True)
p.add_argument("--hold", type=float, default=300.0)
args = p.parse_args()
restart = 1 if os.path.exists(args.restarted_file) else 0
fd = os.open(args.ready_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(fd, f"ready {os.environ['RANK']} {restart} {time.time():.6f} {os.getpid()}\n".encode())
os.close(fd)
if restart == 0:
    time.sleep(args.hold)
