"""The daemon's collectors, one per file, and the table that registers them with their
switches (``table.py``): flight-side (self, phases, arenas, census) read the FlightState,
card-side (cards, holdings) read the card monitor's sampler."""
