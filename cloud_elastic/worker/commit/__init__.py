"""Commit and rollback on the worker: state objects, per-value handlers, snapshot buffers and the commit window."""
