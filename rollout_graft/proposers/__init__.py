"""Draft sources behind one `Proposer` interface."""

from .base import NoProposer, Proposer, StepContext

__all__ = ["NoProposer", "Proposer", "StepContext"]
