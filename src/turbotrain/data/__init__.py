"""Data: fetching real data from package registries, datasets, and the loader that feeds the device."""
