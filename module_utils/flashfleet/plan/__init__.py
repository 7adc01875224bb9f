"""The run plan: a run's settings (settings.RunConfig) and everything derived from a run entry."""
