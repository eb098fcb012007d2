"""Collectives with Horovod's names, their ops and compression, and how state is serialized between workers."""
