"""Agent-CPU probe worker: records how much CPU its launcher agent (its parent) has used when it starts.

Appends ``RANK time agent_cpu main_thread_cpu other_threads_cpu other_thread_count tree_cpu`` to the file
named by argv[1] (seconds; utime+stime from /proc; ``tree_cpu``: the agent and every other process under it,
such as mbr-launch's rank monitor and standbys, but not this worker). Run by benchmarks/agent_cpu.sh under
torchrun and mbr-launch (--standby off, so that the worker's parent is the agent).
"""

import os
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def cpu(path: str) -> float:
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


agent = os.getppid()
total = cpu(f"/proc/{agent}/stat")
main = cpu(f"/proc/{agent}/task/{agent}/stat")
others = []
for tid in os.listdir(f"/proc/{agent}/task"):
    if int(tid) != agent:
        try:
            others.append(cpu(f"/proc/{agent}/task/{tid}/stat"))
        except OSError:
            pass


def descendants(pid: int) -> list[int]:
    found = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except OSError:
            continue
        for kid in kids:
            if kid != os.getpid():
                found += [kid, *descendants(kid)]
    return found


tree = total
for pid in descendants(agent):
    try:
        tree += cpu(f"/proc/{pid}/stat")
    except OSError:
        pass
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(fd, f"{os.environ['RANK']} {time.time():.3f} {total:.3f} {main:.3f} {sum(others):.3f} {len(others)} {tree:.3f}\n".encode())
os.close(fd)
