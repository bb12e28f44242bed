"""``hami-dra explain pod/NAME``: why the controller put a pod's GPUs where it did, or why not yet."""
