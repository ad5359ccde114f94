"""A stand-in for the parts of Kubernetes that schedule and run pods, for end-to-end tests of the operator.

- :mod:`tests.operator.kubeemu`: the emulated API server (objects, watches, ``/status``);
- :mod:`tests.harness.controllers`: a StatefulSet controller (pods with ordinal names, one PVC per claim
  template and pod, kept when the StatefulSet goes), a Job controller and an ownerReference garbage
  collector;
- :mod:`tests.harness.kubelet`: runs every pod exactly as its spec says as a real podman container
  (command/args with ``$(VAR)`` expansion, env with fieldRef/configMapKeyRef, a per-PVC podman volume per
  volumeMount, configMap volumes, runAsUser/Group), on a podman network where the pod's and the Services'
  DNS names resolve (``--network-alias``), probes (startup, liveness, readiness) by HTTP to the pod's
  address, restarts per restartPolicy with back-off; readiness becomes the pod's Ready condition and the
  StatefulSet's ``readyReplicas``.

What it is not: no scheduler (every pod runs on this machine), no CNI or kube-proxy (a Service name
resolves to all selected pods, ready or not, instead of a virtual IP over ready endpoints), no resource
limits, no node failures, no real kubelet quirks (image pulls, eviction, probe timing jitter). The only
liberty taken with pod specs is the image of etcd: the upstream image cannot be pulled here, so etcd pods
run the Debian base image with the etcd binary the other tests use mounted at ``/usr/local/bin/etcd``.
"""
