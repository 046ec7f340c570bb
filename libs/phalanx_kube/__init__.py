"""phalanx_kube."""
