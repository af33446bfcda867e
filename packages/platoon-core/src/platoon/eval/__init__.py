"""Evaluation of a policy (a Tinker sampler or a hosted model) over environment entries: `platoon eval`.

Kept import-light: the evaluator's dependencies are imported when an evaluation runs.
"""
