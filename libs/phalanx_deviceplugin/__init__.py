"""phalanx_deviceplugin: the kubelet device plugin the node agent runs (docs/delivery.md).

It advertises the seed's resource names to the kubelet, steers the kubelet to the devices
Phalanx chose, serves ``Allocate`` only for pods named by binder's per-node fence, and hands
the container exactly those GPUs (by CDI name), MIG instance and RDMA devices. ``grpc`` and the
generated kubelet stubs (``phalanx_deviceplugin.kubelet``) are imported only inside this package
(an import-linter contract).
"""
