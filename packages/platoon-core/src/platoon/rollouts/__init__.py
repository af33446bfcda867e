"""The rollout runtime shared by `platoon train` and `platoon eval`: one rollout of one entry (`one_rollout`),
rollout workers and their fork server (`workers`), and the run-directory records (`records`).

Import-light: nothing here imports the Tinker SDK or a tokenizer at module level.
"""
