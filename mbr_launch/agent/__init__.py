"""The per-node agent: the supervision loop and what it does with each event (spawning, failures, hangs, telemetry)."""
