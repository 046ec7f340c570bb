"""phalanx_localstack: the launcher of a whole Phalanx on one machine (``phalanx up``,
``phalanx demo``, the integration tests and the benchmarks): the embedded nats-server with its
auth and TLS (``natsserver``, ``localauth``), the service processes and a simulated cluster
(``stack``), the cluster and workload files it reads (``inputs``), synthetic clusters of many
identical nodes (``synthetic``) and how its children die with it (``children``). No service
imports it (import-linter)."""
