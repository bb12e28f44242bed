"""A real single-node Kubernetes cluster on this machine, from upstream binaries (development tool).

``hami-dra cluster build|up|down|status`` builds kube-apiserver, kube-controller-manager,
kube-scheduler, kubelet, etcd, containerd, crictl and the CNI plugins from their published Go modules
(``hack/cluster/build.sh``, which also builds NVIDIA's ``nvidia-ctk`` for the CDI spec tests) and
runs them as local processes, then (unless ``--no-driver``) the driver itself as host processes. It
is what the real-cluster tests (``tests/cluster/``) run on. Never part of a production deployment:
it needs root, a repository checkout and Go.
"""
