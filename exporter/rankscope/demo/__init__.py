"""`rankscope demo`: a small instrumented multi-rank job, the daemon, Prometheus and
Alertmanager on loopback, and the scenarios that make each page fire (docs in cli.py)."""
