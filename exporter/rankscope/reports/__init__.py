"""What a flight record says, as the CLI prints it and the daemon's API serves it: the
ledger of boot phases, the OOM report and the census report."""
