"""The Harbor export of TextCraft-Synth: `python -m platoon_textcraft.harbor export` (`export.export_dataset`).

Submodules: `export` (the dataset), `card` (its README), `game` (the standard-library `textcraft` command and
verifier every task carries as `textcraft_game.py`), `templates/` (instruction, test script, license).
"""
