"""`make release`: the versioned artifacts of one hami-dra version, built and pushed by one command.

versions.py checks that every file naming the version agrees; changelog.py reads CHANGELOG.md;
chart.py packages the chart with the release's image repository stamped in; registry.py pushes the
image and the chart; checksums.py writes SHA256SUMS; main.py runs them in order.
"""
