"""A training-like worker that talks to the rank monitor through the real NVRx RankMonitorClient.

  --hang KIND      on the first attempt, rank --hang-rank hangs in one of these ways after --hang-after steps:
                   heartbeat (sleeps, no heartbeats), section (sleeps inside section 'step'),
                   oos (sleeps outside any section), sigstop (stops itself), busy (a GIL-holding busy loop)
  --steps N        steps of --step-time seconds; each step: open 'step', heartbeat, close 'step'
  --hang-attempt-steps N  on the hanging attempt every rank makes N steps instead of --steps (the others keep
                   running while the hang is judged, rather than exiting meanwhile)
  --hang-when-ready N  the hanging rank goes on stepping until --ready-file has N lines (every rank started:
                   on a loaded machine a peer may still be importing when the hang starts)
  --ready-file F   append "RANK RESTART TIME" once the client is initialised
  --state F        calc-timeouts mode: after the steps, calculate section timeouts and save state_dict to F;
                   on a restart, load it first and print the enforced 'step' timeout
"""
import argparse
import json
import os
import signal
import time

from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

p = argparse.ArgumentParser()
p.add_argument("--hang", default="")
p.add_argument("--hang-rank", type=int, default=1)
p.add_argument("--hang-after", type=int, default=3)
p.add_argument("--hang-restart", type=int, default=0, help="hang on this attempt only")
p.add_argument("--steps", type=int, default=10)
p.add_argument("--hang-attempt-steps", type=int, default=None)
p.add_argument("--hang-when-ready", type=int, default=0)
p.add_argument("--step-time", type=float, default=0.05)
p.add_argument("--ready-file")
p.add_argument("--state")
args = p.parse_args()

rank, restart = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
client = RankMonitorClient()
if args.state and os.path.exists(args.state):
    with open(args.state) as f:
        client.load_state_dict(json.load(f))
client.init_workload_monitoring()
if args.ready_file:
    with open(args.ready_file, "a") as f:
        f.write(f"{rank} {restart} {time.time()}\n")
print(f"rank {rank} restart {restart} timeouts {client.section_timeouts.section}", flush=True)


def hang_now():
    print(f"rank {rank} hanging: {args.hang} at {time.time():.3f}", flush=True)
    if args.hang == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif args.hang == "busy":
        x = 0
        while True:  # holds the GIL: no Python thread of this process can run
            x += 1
    else:
        time.sleep(3600)


hang_attempt = bool(args.hang) and restart == args.hang_restart
steps = args.hang_attempt_steps if hang_attempt and args.hang_attempt_steps else args.steps


def everyone_ready() -> bool:
    if not args.hang_when_ready:
        return True
    with open(args.ready_file) as f:
        return len(f.read().splitlines()) >= args.hang_when_ready


hang_step = None
for step in range(steps):
    if hang_attempt and rank == args.hang_rank and hang_step is None and step >= args.hang_after and everyone_ready():
        hang_step = step
    should_hang = hang_step == step
    if should_hang and args.hang == "oos":
        hang_now()
    client.start_section("step")
    if should_hang and args.hang == "section":
        hang_now()
    client.send_heartbeat()
    if should_hang and args.hang in ("heartbeat", "sigstop", "busy"):
        hang_now()
    time.sleep(args.step_time)
    client.end_section("step")

if args.state:
    if restart == 0:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        # Only 'step': calculated out-of-section/heartbeat timeouts would (rightly) fire while this attempt
        # tears down on purpose below.
        client.calculate_and_set_section_timeouts(selected_sections=["step"], calc_out_of_section=False)
        if rank == 0:
            with open(args.state, "w") as f:
                json.dump(client.state_dict(), f)
        dist.barrier()
        dist.destroy_process_group()
        raise SystemExit(3)  # fail on purpose so the launcher restarts with the saved timeouts
    print(f"rank {rank} enforced step timeout {client.section_timeouts.section['step']}", flush=True)
client.shutdown_workload_monitoring()
