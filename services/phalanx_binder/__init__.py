"""phalanx_binder."""
