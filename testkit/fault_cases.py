"""The fault matrix of issue 16: every fault, how it is injected, what must come of it. One table, run by
tests/test_fault_matrix.py (pass/fail) and benchmarks/bench_faults.py (timings, torchrun beside us).

A case expects, per agent, the exit code (0: the job survived and finished; otherwise the code documented in
mbr_launch/report/exitcodes.py and README.md) and the events that record the fault (cause, rank, exit code or
signal). ``fault_spec.verify`` also demands whole lines in every events.jsonl and no process of a killed
agent left alive; the tests' autouse fixture (and the bench's token) catch any other leftover process.
Scenarios: fault_workers (workers, monitor), fault_agents (launcher signals, agents, nodes, rendezvous),
fault_inputs (disk, config, ports), fault_slurm (preemption under Slurm).
"""

from __future__ import annotations

from . import fault_agents as agents
from . import fault_inputs as inputs
from . import fault_slurm as slurm
from . import fault_workers as workers
from .fault_spec import Case, Expect, has, is_

F16FILES = "helper f16files: logs and the event log survive ENOSPC"
F16INPUT = "helper f16input: bad input exits 2 at once with one line"
T = workers.HANG_TIMEOUT
NO_MONITOR_ORPHANS = ("with --rank-monitor off nothing kills a worker's children when the launcher is SIGKILLed: "
                      "the workers die of their parent-death signal, their children (sleep 600) live on")
# Binary garbage as a YAML config (issue 16, finding 9): NULs, control and high bytes.
GARBAGE = bytes(range(256)) * 4

CASES: list[Case] = [
    # ---- workers --------------------------------------------------------------------------------------
    Case("worker_sigkill", "rank 1 of 2 SIGKILLs itself after its first all_reduce; --max-restarts 1",
         workers.worker_sigkill, (0,), (Expect("failure", {"rank": 1, "cause": "crash", "signal": "SIGKILL"}),),
         check=workers.check_sigkill, torchrun=workers.torchrun_train("--crash-rank", "1")),
    Case("worker_exit", "rank 0 of 2 exits 3 on every attempt; --max-restarts 1 (the budget runs out)",
         workers.worker_exit, (1,), (Expect("failure", {"rank": 0, "cause": "crash", "exit_code": 3}),
                                     Expect("end", {"exit_code": 1})),
         check=workers.check_budget, torchrun=workers.torchrun_train("--exit-rank", "0", "--exit-code", "3")),
    Case("worker_exit_no_restart", "rank 1 exits 17, a --no-restart-exit-codes code; --max-restarts 3",
         workers.worker_exit_no_restart, (1,), (Expect("failure", {"rank": 1, "cause": "crash", "exit_code": 17}),),
         check=workers.check_no_restart),
    Case("worker_sigstop", f"rank 1 SIGSTOPs itself between NVRx heartbeats; --heartbeat-timeout {T:g}",
         workers.nvrx_hang("sigstop"), (0,), (Expect("hang", {"rank": 1, "kind": "heartbeat"}),
                                              Expect("failure", {"rank": 1, "cause": "hang"})),
         check=workers.check_nvrx_hang, torchrun=workers.torchrun_hang("sigstop")),
    Case("worker_busy_gil", f"rank 1 spins in a pure-Python loop holding the GIL; --heartbeat-timeout {T:g}",
         workers.nvrx_hang("busy"), (0,), (Expect("hang", {"rank": 1, "kind": "heartbeat"}),
                                           Expect("failure", {"rank": 1, "cause": "hang"})),
         check=workers.check_nvrx_hang, torchrun=workers.torchrun_hang("busy")),
    Case("collective_hang", "rank 1 waits in a barrier its peer never enters (the peer waits in all_reduce); "
         "--step-timeout 3", workers.collective_hang, (0,),
         (Expect("verdict", {"culprits": [1], "waiting": [0]}), Expect("failure", {"rank": 1, "cause": "hang"})),
         torchrun=workers.torchrun_hang("other_collective"),
         tested_by="tests/test_hang_verdict.py, scenario other_collective-none-r1of2 (its verdict, failure and stacks)"),
    Case("monitor_killed", "the rank monitor process is SIGKILLed while 2 ranks train", workers.monitor_killed, (0,),
         (Expect("monitor_lost"), Expect("failure", {"cause": "monitor"})), check=workers.check_monitor),
    Case("two_failures", "ranks 0 and 2 of 3 are SIGKILLed at the same moment; --max-restarts 1",
         workers.two_failures, (0,), (Expect("failure", {"round": 0, "rank": is_(0, 2), "cause": "crash",
                                                         "signal": "SIGKILL"}),),
         check=workers.check_two_failures),
    Case("all_ranks", "both ranks SIGKILL themselves at the same moment; --max-restarts 1",
         workers.all_ranks_sigkill, (0,), (Expect("failure", {"round": 0, "cause": "crash", "signal": "SIGKILL"}),),
         check=workers.check_all_ranks),
    Case("failure_during_restart", "rank 1 exits 1; in the restarted round rank 0 exits 1 as it starts; "
         "--max-restarts 2", workers.failure_during_restart, (0,),
         (Expect("failure", {"round": 1, "rank": 0, "cause": "crash", "exit_code": 1}),),
         check=workers.check_failure_during_restart),
    Case("crash_loop", "the only rank exits 1 at once on every attempt; --max-restarts 3 --restart-backoff 0.5",
         workers.crash_loop, (1,), (Expect("restart", {"backoff": 1.0}), Expect("end", {"exit_code": 1})),
         check=workers.check_backoff),
    # ---- the launcher and its node ---------------------------------------------------------------------
    Case("agent_sigterm", "the launcher gets SIGTERM (preemption); workers checkpoint on their SIGTERM",
         agents.signalled(15), (5,), (Expect("preemption", {"signal": "SIGTERM", "forward": "SIGTERM"}),
                                      Expect("end", {"exit_code": 5})), check=agents.check_checkpointed),
    Case("agent_sigterm_grace_expires", "the launcher gets SIGTERM, --preempt-grace 1; workers and their children "
         "ignore SIGTERM", agents.grace_expires, (5,), (Expect("preemption", {"signal": "SIGTERM", "grace": 1.0}),
                                                       Expect("worker_exit", {"signal": "SIGKILL"}),
                                                       Expect("end", {"exit_code": 5})), check=agents.check_grace_expired),
    Case("agent_sigint", "the launcher gets SIGINT (Ctrl-C): forwarded to the workers", agents.signalled(2), (130,),
         (Expect("signal", {"signal": "SIGINT"}), Expect("end", {"exit_code": 130})), check=agents.check_forwarded),
    Case("preempt_usr1", "SIGUSR1 to every worker, then to the launcher (as Slurm's scancel --signal=USR1)",
         agents.signalled(10, every_process=True), (5,),
         (Expect("preemption", {"signal": "SIGUSR1", "forward": "SIGTERM"}), Expect("end", {"exit_code": 5})),
         check=agents.check_checkpointed),
    Case("launcher_sigkill", "the launcher of 2 ranks, each with a child process, is SIGKILLed",
         agents.launcher_sigkill("on"), (None,), (), check=agents.check_gone_at_once),
    Case("launcher_sigkill_no_monitor", "the same with --rank-monitor off", agents.launcher_sigkill("off"), (None,),
         (), check=agents.check_gone_at_once, known_bug=NO_MONITOR_ORPHANS),
    Case("signal_in_rendezvous", "the launcher gets SIGTERM while it waits in the rendezvous for a 2nd node",
         agents.signal_in_rendezvous, (5,), (Expect("preemption", {"signal": "SIGTERM"}),
                                            Expect("end", {"exit_code": 5}))),
    Case("agent_sigkill", "one of 3 agents (--nnodes 2:3) is SIGKILLed; workers share no collective",
         agents.agent_sigkill, (0, 0, None), (Expect("peer_lost", {"kind": "peer_lost"}),
                                              Expect("failure", {"cause": "peer"})), check=agents.check_agent_sigkill),
    Case("store_host_lost", "the agent hosting the rendezvous store (of 2, --nnodes 2) is SIGKILLed",
         agents.store_host_lost, (None, 3), (Expect("peer_lost", {"kind": "store_lost"}, agent=1),
                                             Expect("end", {"exit_code": 3}, agent=1))),
    Case("store_host_lost_in_collective", "the agent hosting the store (of 3, --nnodes 2:3) is SIGKILLed while "
         "every rank is in a gloo all-reduce", agents.store_host_lost_in_collective, (None, 3, 3),
         (Expect("peer_lost", {"kind": "store_lost"}, agent=1), Expect("end", {"exit_code": 3}, agent=2)),
         check=agents.check_store_lost_said),
    Case("store_apart_node_lost", "the store served apart by `mbr-launch store`; of 3 agents (--nnodes 2:3, a gloo "
         "all-reduce every step), the one on the store's endpoint is SIGKILLed", agents.store_apart_node_lost,
         (0, None, 0, 0), (Expect("end", {"exit_code": 0}, agent=2), Expect("end", {"exit_code": 0}, agent=3))),
    Case("rendezvous_failure", "2 of --nnodes 3 agents wait in the rendezvous; one is SIGKILLed there",
         agents.rendezvous_failure, (3, None), (Expect("end", {"exit_code": 3, "reason": has("the rendezvous timed out after 6 s")}, agent=0),)),
    Case("node_cut", "node 2 of 3 (--nnodes 3, network namespaces) loses its link", agents.node_cut("3", 60),
         (1, 1, 3), (Expect("peer_lost", {"kind": "peer_lost"}, agent=0), Expect("failure", {"cause": "peer"}),
                     Expect("end", {"exit_code": 3}, agent=2)),
         needs=("root", "netns"), check=agents.check_cut_fixed),
    Case("node_cut_elastic", "node 2 of 3 (--nnodes 2:3, network namespaces) loses its link",
         agents.node_cut("2:3", 8), (0, 0, 3), (Expect("peer_lost", {"kind": "peer_lost"}),
                                                Expect("end", {"exit_code": 3}, agent=2)),
         needs=("root", "netns"), check=agents.check_cut_elastic),
    # ---- Slurm --------------------------------------------------------------------------------------
    Case("slurm_usr1", "scancel --signal=USR1 on a 2-node job (one launcher per node)", slurm.slurm_usr1, (5, 5),
         (Expect("preemption", {"signal": "SIGUSR1"}, agent=0), Expect("preemption", {"signal": "SIGUSR1"}, agent=1)),
         needs=("root", "slurm"), check=slurm.check_usr1),
    Case("slurm_term_requeue", "scancel --signal=TERM on a 2-node job with --requeue-on-preemption",
         slurm.slurm_term_requeue, (5, 5, 0, 0),
         (Expect("preemption", {"signal": "SIGTERM"}, agent=0), Expect("requeue", {"ok": True}, agent=0)),
         needs=("root", "slurm"), check=slurm.check_requeue),
    Case("slurm_term_one_late", f"scancel --signal=TERM on a 2-node job while one launcher is stopped for "
         f"{slurm.LATE:g} s", slurm.slurm_term_one_late, (5, 5),
         (Expect("preemption", {"signal": "SIGTERM"}, agent=0), Expect("preemption", {"signal": "SIGTERM"}, agent=1)),
         needs=("root", "slurm"), check=slurm.check_one_late),
    Case("slurm_kill_one", "a plain kill (SIGTERM) of one launcher of a 2-node job (--nnodes 1:2)",
         slurm.slurm_kill_one, (0, 6),
         (Expect("node_left", {"signal": "SIGTERM"}, agent=1), Expect("end", {"exit_code": 6}, agent=1)),
         needs=("root", "slurm"), check=slurm.check_kill_one),
    # ---- surroundings -----------------------------------------------------------------------------------
    Case("log_disk_full", "--log-dir on a 64 KiB tmpfs, --tee 3, two ranks print 600 KiB", inputs.log_disk_full,
         (0,), (), needs=("root",), check=inputs.check_disk_full, pending=F16FILES),
    Case("bad_config_yaml", "--config is 1 KiB of binary garbage", inputs.bad_input(config=GARBAGE), (2,), (),
         check=inputs.check_bad_config, pending=F16INPUT),
    Case("bad_config_rdzv_conf", "--rdzv-conf join_timeout=abc", inputs.bad_input("--rdzv-conf", "join_timeout=abc"),
         (2,), (), check=inputs.check_bad_config, pending=F16INPUT),
    Case("port_in_use", "the c10d endpoint's port, then the static --master-port, is held by another process",
         inputs.port_in_use, (2, 2), (), check=inputs.check_port),
]
CASES_BY_NAME = {c.name: c for c in CASES}
assert len(CASES_BY_NAME) == len(CASES), "case names must be unique"
