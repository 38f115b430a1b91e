"""Worker processes of this node: spawning (own session, parent-death signal, pidfd), output, environment, standbys, stacks."""
