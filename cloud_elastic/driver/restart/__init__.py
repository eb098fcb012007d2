"""A restarted driver: finding its predecessor, waiting for it, and adopting its running workers."""
