"""The worker's link to its driver: signed requests, heartbeats, notices and progress reports."""
