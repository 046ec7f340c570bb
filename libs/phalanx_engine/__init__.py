"""phalanx_engine."""
