"""The typed model of the ``resource.k8s.io/v1`` objects (and the Pods and Nodes) we read and write.

Each object is parsed once where it arrives (an informer event, a write's result) and each change
is serialised once where it leaves:

* ``objects`` — Pod, ResourceClaim, DeviceClass views;
* ``nodes`` — the Node view; node selector and taint rules;
* ``requests`` — a claim's device requests of our classes (selectors, capacity, count);
* ``refs`` — who names what: a claim's requests and their classes, a pod's containers and the
  claims they consume, an allocation's results;
* ``capacity`` — what an allocation result consumes of a device (no shareID = the whole card);
* ``uses`` — a claim's allocation read as the device uses it takes;
* ``slices`` — ResourceSlice device and attribute names, and a published device read back (the
  controller consumes them);
* ``slice_builder`` — a node's GPUs (``dra_driver.devices.Gpu``) as the ResourceSlices of its
  pool, with those names (the kubelet plugin publishes them; ``devices`` and the fake nodes print
  and create them);
* ``edits`` — the finalizer, allocation, gate, condition and fence writes.
"""
