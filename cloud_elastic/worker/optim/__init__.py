"""``DistributedOptimizer``: gradient buckets and the zero-copy update after a commit."""
