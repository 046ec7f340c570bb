"""phalanx_mig_manager."""
