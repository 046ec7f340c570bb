"""phalanx_node_fleet."""
