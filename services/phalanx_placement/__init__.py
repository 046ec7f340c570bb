"""phalanx_placement."""
