"""The leaf of the package: hook points, the config, errors, validation, dtypes and small utilities.

Nothing here imports anything else of `hooked`; every other layer builds on it.
"""
