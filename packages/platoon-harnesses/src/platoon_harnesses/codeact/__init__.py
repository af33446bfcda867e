"""`platoon-codeact`: the model writes Python cells that call environment tools as functions.

The harness lives in `harness`, the IPython executor in `executor` (imported only when an agent runs).
"""
