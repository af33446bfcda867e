"""`platoon-codeact`: the model writes Python cells that call environment tools as functions (harness.md 4.2).

The harness lives in `harness`, the IPython executor in `executor` (imported only when an agent runs).
"""
