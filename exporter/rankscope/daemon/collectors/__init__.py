"""The daemon's flight-side collectors, one per file (the card-side ones live with the
sampler in rankscope.daemon.cards)."""
