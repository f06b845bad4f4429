"""The signal sources, one room per signal: the calls (`calls/`: probe, events, attribution),
DRM fdinfo usage, GPU jobs, device wedges (uevents), device telemetry and its energy split, and
allocations; `base` is the protocol and what the framework does for every source, `registry`
lists them. Importing this package loads nothing: kubenpuctl imports its pure readers
(`fdinfo`, `sysfs`) without the agent."""
