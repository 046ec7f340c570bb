"""phalanx_cli."""
