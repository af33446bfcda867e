"""platoon-harnesses: a first-party plugin package of platoon, found through entry points."""
