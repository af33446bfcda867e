"""Reinforcement learning through a Tinker-compatible service: the config (`config_defs`), trainer and workflows.

Kept import-light: the Tinker SDK and tokenizers are imported inside the functions that need them.
"""
