"""``hami-dra simulate``: run the placement engine offline on a scenario file and explain each decision."""
