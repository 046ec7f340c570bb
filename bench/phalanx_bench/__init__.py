"""Code only the benchmarks and their tests use: baseline policies (first fit) and the
GPU-share packing research model. Production code never imports it (import-linter)."""
