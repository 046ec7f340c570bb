"""phalanx_topology_discovery."""
