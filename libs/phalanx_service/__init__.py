"""phalanx_service: the shell one service process runs in (``shell.serve``: logs, tracing, the
health and metrics endpoint, signals, readiness), as ``phalanx run SERVICE`` starts it in every
Deployment and DaemonSet. The local stack that starts many such processes is
``phalanx_localstack``."""
