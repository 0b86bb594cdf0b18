"""What a flight record says, as the CLI prints it and the API serves it: ledger, OOM, census."""
