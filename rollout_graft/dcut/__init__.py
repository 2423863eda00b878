"""D-cut: how much of each step's draft the target verifies, for both backends (DESIGN.md, "Budget policies").

    core.py    numpy only, both backends: BudgetDecision, ScoreCalibration (raw score → observed
               acceptance), ProbeCredit (when to propose again after a plain decision), CostFit (the
               exponentially weighted least-squares step-cost fit) and RowCost (the same fit of a + b·rows,
               in closed form)
    trees.py   the engine's policies over draft trees (TreePolicy: FixedBudget, DCut) and their step
               cost (TreeStepCost: the profiled `cost.CostModel` as a prior, corrected by measured steps)
    chains.py  the vLLM proposer's policies over draft chains (ChainPolicy: FixedDepth, ChainDCut) and
               their step cost (step_cost_fit: vLLM's steps fitted online)

The package imports none of its modules: the vLLM worker imports `core` and `chains` only, never
the engine's side (`trees` → `cost` → the model runner → transformers).
"""
