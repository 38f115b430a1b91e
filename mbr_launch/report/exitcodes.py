"""The launcher's exit codes (documented in README.md and the man page)."""

OK = 0  # every worker of every node succeeded
FAILED = 1  # workers failed and the job did not recover (restart budget spent, or a no-restart exit code)
USAGE = 2  # bad command line, configuration or environment: nothing was started
RENDEZVOUS = 3  # the rendezvous failed: timed out, closed, or its store host was lost
INTERNAL = 4  # a bug or an unexpected error in mbr-launch itself
PREEMPTED = 5  # a preemption signal reached every node of the round: workers were asked to checkpoint, then stopped
EXCLUDED = 6  # this node left the job (a stop signal reached it alone, it failed too often, a worker asked); the rest go on
UNHEALTHY = 7  # this node failed a pre-rendezvous health check and did not join; the rest go on
NO_RESTART = 93  # ft_launcher 0.6+'s "do not requeue": no progress across --ft-max-no-progress-cycles cycles
DOCTOR_NOT_RUN = 3  # ``mbr-launch doctor`` could not run its checks (0 ok, 1 warnings, 2 errors)

TABLE = (
    (OK, "every worker of every node succeeded; or, for an agent still waiting to join a round (a spare), "
         "the job ended on the other nodes, which report its outcome"),
    (FAILED, "workers failed and the job did not recover (restart budget spent, a no-restart exit code, "
             "or a worker asked to shut the workload down)"),
    (USAGE, "bad command line, configuration or environment; nothing was started"),
    (RENDEZVOUS, "the rendezvous failed (timed out, closed, or its store host was lost: also when a stop signal "
                 "reached the node that serves the store and not the others)"),
    (INTERNAL, "an unexpected error inside mbr-launch (please report it)"),
    (PREEMPTED, "preempted: a --preempt-signals signal (e.g. SIGTERM from scancel or SIGUSR1 from srun --signal) "
                "reached every node of the round; the workers were asked to checkpoint, then stopped (and the job "
                "requeued with --requeue-on-preemption)"),
    (EXCLUDED, "this node left the job and the other nodes go on without it: a stop signal reached this node and "
               "not every node (a kill of one launcher, a drained node), its ranks failed --max-node-failures "
               "times, or a worker sent NVRx ExcludeThisNode"),
    (UNHEALTHY, "this node failed a health check before joining a round (--ft-enable-nic-healthcheck, "
                "--ft-storage-health-check-path, ...) and did not join; the other nodes go on without it where "
                "--nnodes MIN:MAX allows"),
    (NO_RESTART, "the job stopped instead of restarting: --ft-max-no-progress-cycles cycles in a row ended without "
                 "the training iteration advancing (ft_launcher's \"do not requeue\"; --ft-no-restart-exit-code "
                 "sets another code); every node exits with it"),
    ("128+N", "stopped by another handled signal N that reached every node of the round, after forwarding it "
              "to the workers (130 SIGINT)"),
)
