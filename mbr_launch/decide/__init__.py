"""Pure decisions: facts in, decision out; no IO, no clocks (time is passed in)."""
