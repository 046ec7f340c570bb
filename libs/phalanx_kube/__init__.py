"""phalanx_kube: the Kubernetes port and its two adapters.

* ``phalanx_kube.port`` — the ``ClusterPort`` protocol and the ``Pod``/``Node`` structs;
* ``phalanx_kube.kvcluster`` — ``KvCluster``, the simulated cluster in NATS KV (``--cluster sim``);
* ``phalanx_kube.kube`` — ``KubeCluster``, the real API server over kubernetes-asyncio
  (``--cluster kube``).

The adapters are imported by module path, so importing this package costs neither NATS nor
kubernetes-asyncio.
"""
