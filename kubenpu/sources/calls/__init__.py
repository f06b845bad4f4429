"""The calls: the probe's ring buffer and maps (probe), their records tallied (events) and counted
per pod (attribution). The hot path, run by the agent's loop itself."""
