"""Run start-up: every check a run makes before it starts, `platoon prepare`, the preamble `platoon train`, `eval`
and `rollout` share (`config validate` reports the same checks), and the start of each run, in order.

It stands above `train/` and `eval/`: the command line calls it, it checks the run, then hands the checked start
down to the trainer or the evaluator. Nothing below it imports it.
"""
