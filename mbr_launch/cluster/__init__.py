"""What crosses nodes: torch's c10d rendezvous, stop messages, peer liveness, the store guard, Slurm requeue."""
