"""Starting and stopping worker processes: on this machine (fork server) and on remote hosts (SSH)."""
