"""phalanx_gang_coordinator."""
