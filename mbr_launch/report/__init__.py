"""What a run leaves behind: the event log, the failure summary, exit codes."""
