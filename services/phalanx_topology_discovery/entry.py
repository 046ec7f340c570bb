"""Publish this node's GPU/NIC topology, heartbeat and extended resources."""

from __future__ import annotations

import os

import anyio

NEEDS_CLUSTER = True
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
STATE_DIR = "/var/lib/phalanx/deviceplugin"


def add_arguments(p) -> None:
    p.add_argument("--node", default=os.environ.get("NODE_NAME"), required=not os.environ.get("NODE_NAME"),
                   help="this node's name (env NODE_NAME)")
    p.add_argument("--topology-file", default=os.environ.get("PHALANX_TOPOLOGY_FILE"),
                   help="read the topology from an 'nvidia-smi topo -m' or Phalanx YAML file instead of NVML")
    p.add_argument("--gpu-model", default="", help="GPU model for a topology file that does not name it "
                   "(nvidia-smi topo -m prints no model)")
    p.add_argument("--gpu-memory-mib", type=int, default=0, help="GPU memory (MiB) for a topology file without it")
    p.add_argument("--mig-enabled", action="store_true",
                   help="mark the file's MIG-capable GPUs as in MIG mode (NVML reports the real mode)")
    p.add_argument("--heartbeat-s", type=float, default=3.0, help="seconds between heartbeats (default %(default)s)")
    p.add_argument("--node-state-debounce-s", type=float, default=0.5,
                   help="at most one report of the node's Kubernetes state per this many seconds (default %(default)s)")
    p.add_argument("--node-state-reassert-s", type=float, default=30.0,
                   help="read the stored Kubernetes state back this often and write it again if it is not this "
                        "node's (deleted, lost) (default %(default)s)")
    g = p.add_argument_group("device plugin (docs/delivery.md)")
    g.add_argument("--advertise", choices=("auto", "device-plugin", "node-status"),
                   default=os.environ.get("PHALANX_ADVERTISE", "auto"),
                   help="how the node's GPU resources reach the kubelet: 'device-plugin' serves them (a real node; "
                   "the DaemonSet sets this), 'node-status' patches them into the Node status (the simulator and "
                   "kwok, which have no kubelet); 'auto' = device-plugin when the kubelet's registration socket exists")
    g.add_argument("--device-plugin-dir", default=os.environ.get("PHALANX_DEVICE_PLUGIN_DIR", DEVICE_PLUGIN_DIR),
                   help="the kubelet's device-plugin directory (default %(default)s)")
    g.add_argument("--pod-resources-socket", default=os.environ.get("PHALANX_POD_RESOURCES_SOCKET", POD_RESOURCES_SOCKET),
                   help="the kubelet's PodResources socket (default %(default)s)")
    g.add_argument("--state-dir", default=os.environ.get("PHALANX_STATE_DIR", STATE_DIR),
                   help="where the plugin keeps what it served, across restarts (default %(default)s)")
    g.add_argument("--fence-namespace", default=os.environ.get("POD_NAMESPACE", "phalanx-system"),
                   help="namespace of binder's per-node fence leases (default: $POD_NAMESPACE or phalanx-system)")
    g.add_argument("--no-cdi", action="store_true",
                   help="name GPUs in NVIDIA_VISIBLE_DEVICES instead of CDI (only where the node has no CDI; "
                   "see docs/delivery.md for why env-var delivery is not access control)")
    g.add_argument("--sysfs-root", default=os.environ.get("PHALANX_SYSFS_ROOT", "/"),
                   help="the directory holding the host's sys/ (RDMA device nodes of the chosen NICs are read from "
                   "<root>/sys/class/infiniband; default %(default)s)")
    g.add_argument("--mps-pipe-dir", default="", help="the node's MPS control daemon pipe directory, if it runs one")
    g.add_argument("--mps-active-thread-pct", type=int, default=0,
                   help="the MPS daemon's default active thread percentage (what it enforces on every client)")
    g.add_argument("--mps-pinned-mem-mib", type=int, default=0,
                   help="the MPS daemon's default pinned device memory limit in MiB")


def _reader(args):
    if args.topology_file:
        from phalanx_topology_discovery.service import topology_from_file

        topo = topology_from_file(args.topology_file, args.node, gpu_model=args.gpu_model,
                                  gpu_memory_mib=args.gpu_memory_mib, mig_enabled=args.mig_enabled)
        return lambda: topo
    from phalanx_nvml import NvmlDiscovery

    nvml = NvmlDiscovery()
    return lambda: nvml.discover(args.node)


def _agent(args, cluster):
    """The device plugin agent factory, or None for ``node-status``."""
    from phalanx_deviceplugin import agent as A
    from phalanx_deviceplugin import delivery as dv

    mode = args.advertise
    if mode == "auto":
        mode = "device-plugin" if A.kubelet_present(args.device_plugin_dir) else "node-status"
    if mode == "node-status":
        return None
    mps = dv.Mps(args.mps_pipe_dir, args.mps_active_thread_pct, args.mps_pinned_mem_mib) if args.mps_pipe_dir else None
    config = A.AgentConfig(node=args.node, socket_dir=args.device_plugin_dir,
                           pod_resources_socket=args.pod_resources_socket, state_dir=args.state_dir,
                           fence_namespace=args.fence_namespace, delivery=dv.Delivery(cdi=not args.no_cdi, mps=mps,
                                                                   sysfs_root=args.sysfs_root))
    unhealthy = lambda uuids: frozenset()  # noqa: E731 - a topology file has no NVML to ask
    if not args.topology_file:
        from phalanx_nvml.health import NvmlHealth

        unhealthy = NvmlHealth().unhealthy
    return lambda tg: A.PluginAgent(tg, cluster, config, unhealthy)


async def start(args, bus, cluster, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    from phalanx_topology_discovery.service import Config, run

    await run(bus, cluster, Config(node=args.node, heartbeat_s=args.heartbeat_s,
                                  node_state_debounce_s=args.node_state_debounce_s,
                                  node_state_reassert_s=args.node_state_reassert_s), _reader(args),
              agent=_agent(args, cluster), task_status=task_status)
