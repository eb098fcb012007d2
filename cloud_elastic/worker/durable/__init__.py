"""The worker's durable-checkpoint schedules: rank 0 for replicas, every host's workers for a sharded model."""
