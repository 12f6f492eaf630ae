"""Many hosts at once: the fan-out, the per-task runner, rolling deploys, Ray clusters."""
