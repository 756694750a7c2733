"""Where a run meets its executor: the agent protocol the workers speak, attempt outcomes, and the reaper and re-send
loop."""
