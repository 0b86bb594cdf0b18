"""What runs inside a host program: the probe, the census, the adapters, the arming and the
writer. Nothing here raises into the host or blocks it. The daemon and the readers never
import this package (tests/test_layout.py checks it in a fresh interpreter)."""
