"""Code only the benchmarks and their tests use: baseline policies (first fit), the GPU-share
packing research model (``sharepack``, ``sharepolicies``, ``sharecluster``), the peers bench's
scenarios and figures, the engine replay and the plots. Production code never imports it
(import-linter)."""
