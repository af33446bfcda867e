"""Training: the Tinker RL trainer lives in `platoon.train.tinker`.

Kept import-light: importing this package imports nothing heavy.
"""
