"""A worker that talks to the rank monitor through the real NVRx 0.4.1 RankMonitorClient (hostile-input tests).

  steady SECONDS READY    heartbeat every 50 ms for SECONDS; once connected, write the monitor socket path
                          to READY (the test then plays a foreign process on that socket)
  odd_request             rank 0 sends ShutdownWorkload with a rank that is not an integer, prints how it was
                          answered, then heartbeats a little and exits 0
"""
import os
import sys
import time

from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient, WorkloadAction, WorkloadControlRequest

mode, args = sys.argv[1], sys.argv[2:]
client = RankMonitorClient()
client.init_workload_monitoring()
rank = int(os.environ["RANK"])
if mode == "steady":
    if rank == 0:
        with open(args[1] + ".tmp", "w") as f:
            f.write(os.environ["FT_RANK_MONITOR_IPC_SOCKET"])
        os.rename(args[1] + ".tmp", args[1])
    end, beats = time.monotonic() + float(args[0]), 0
    while time.monotonic() < end:
        client.send_heartbeat()
        beats += 1
        time.sleep(0.05)
    print(f"rank {rank}: {beats} heartbeats", flush=True)
elif mode == "odd_request":
    if rank == 0:
        client.rank_info.global_rank = None  # only for this request: heartbeats carry the rank too
        try:
            client.send_workload_control_request(WorkloadControlRequest(WorkloadAction.ShutdownWorkload, "odd"))
            print("request accepted", flush=True)
        except RuntimeError as err:
            print(f"request answered: {err}", flush=True)
        client.rank_info.global_rank = rank
    for _ in range(10):
        client.send_heartbeat()
        time.sleep(0.05)
    print(f"rank {rank}: done", flush=True)
