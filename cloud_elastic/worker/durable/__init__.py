"""The worker's durable-checkpoint schedules (``api.DurableSchedule``): rank 0 for replicas, every host's workers
for a sharded model. ``cloud_elastic.checkpoint`` is their storage."""
