"""The round core: engines that run a run's rounds, composed of small parts."""
