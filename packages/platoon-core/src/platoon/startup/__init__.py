"""Run start-up: every check a run makes before it starts, `platoon prepare`, and the preamble `platoon train`,
`eval` and `rollout` share (`config validate` reports the same checks).

It stands above `rollouts/` and below `train/` and `eval/`: those call down into it, and it calls down into config,
harnesses, environments, the gateway and the rollout records, never up.
"""
