"""phalanx_nvmlfake: fake NVML hardware for the tests and the simulator, under ``fleet/``, which the
image does not ship. ``nvml.FakeNvml`` has the pynvml functions the topology adapter calls
(``nvml.FakeMachine`` lays out fake hardware from a ``NodeTopology``, PCIe tree from ``pci``);
``mig.FakeMigNvml`` has the MIG ones, with the driver's rules from ``phalanx_engine.mig``. The
real adapter's code runs unchanged on them (``phalanx_nvml``)."""
