"""``hami-dra demo`` (``make demo``): the whole driver on one simulated lab node, in under a minute.

The sandbox cluster (``hami_dra_dev.sandbox``) runs one node with four simulated Tesla T4s; the real
kubelet plugin publishes its ResourceSlice and writes CDI specs, the real webhook gates the pods and
the real controller places them with the policy engine. The worked example is replayed
(two 1000 MiB tenants on GPU 0, one on GPU 1, then a ``mutex,binpack`` pod -> GPU 2) and a ``mutex``
pod waits, Pending with its reason, until a card is freed. Every outcome is checked; the exit code
is 0 only when all of them were observed.

Modules: ``manifests`` (objects), ``node``/``webhook``/``controller``/``stack`` (what runs),
``observe`` (reading the cluster), ``scenario`` (the steps and checks), ``render`` (rich output),
``command`` (the CLI). Development tool only, like the sandbox it runs on.
"""
