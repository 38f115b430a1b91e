"""One rank of the torchrun table (tests/test_torchrun_table.py), the same under both launchers.

Writes what it saw to ``$TABLE_OUT/<RANK>.<TORCHELASTIC_RESTART_COUNT>.json`` (the launch environment the
table compares, its arguments, ``__name__``), prints one line on stdout and one on stderr, then does what
``TABLE_*`` asks: ``TABLE_INIT`` env|tcp: ``init_process_group("gloo")`` by ``env://`` or by
``tcp://MASTER_ADDR:MASTER_PORT`` (as older scripts build it from what they gave the launcher) and one
all_reduce; ``TABLE_FAIL`` ``RANK:CODE``: that rank exits with CODE in the first attempt, once every rank of
that attempt has written its record. No torch import unless asked: most rows only look at the environment.
"""
import json
import os
import sys
import time

SEEN = ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
        "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_USE_AGENT_STORE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")
rank, restart = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
record = {"env": {k: os.environ.get(k) for k in SEEN}, "argv": sys.argv[1:], "name": __name__}
print(f"probe out rank {rank}", flush=True)
print(f"probe err rank {rank}", file=sys.stderr, flush=True)
init = os.environ.get("TABLE_INIT")
if init:
    import torch
    import torch.distributed as dist

    method = "env://" if init == "env" else f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    if init == "env":
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", init_method=method, rank=int(rank), world_size=int(os.environ["WORLD_SIZE"]))
    t = torch.ones(1)
    dist.all_reduce(t)
    record["sum"] = t.item()
    dist.destroy_process_group()
out = os.environ["TABLE_OUT"]
with open(os.path.join(out, f".{rank}.{restart}.tmp"), "w") as f:
    json.dump(record, f)
os.rename(f.name, os.path.join(out, f"{rank}.{restart}.json"))  # whole or absent: the others wait for it below
fail_rank, _, code = os.environ.get("TABLE_FAIL", "").partition(":")
if fail_rank == rank and restart == "0":
    # Fail once every rank of this attempt wrote its record: else a launcher that stops the others at once (both
    # do) decides, by how busy the machine is, whether a slower rank's record of this attempt exists.
    end = time.monotonic() + 60
    while time.monotonic() < end and not all(os.path.exists(os.path.join(out, f"{r}.{restart}.json"))
                                             for r in range(int(os.environ["WORLD_SIZE"]))):
        time.sleep(0.05)
    sys.exit(int(code))
