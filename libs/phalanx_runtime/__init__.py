"""phalanx_runtime."""
