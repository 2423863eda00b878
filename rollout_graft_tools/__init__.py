"""Research tooling beside the rollout path (`rollout_graft` never imports it): acceptance studies
by replay (`replay`) and upper bounds of what a drafter could accept (`bounds`)."""
