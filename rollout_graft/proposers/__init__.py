"""Draft sources behind one `Proposer` interface."""

from .base import NoProposer, Proposer, StepContext
from .drafter import DrafterProposer
from .graft import GraftProposer
from .retrieval import RetrievalProposer

__all__ = ["DrafterProposer", "GraftProposer", "NoProposer", "Proposer", "RetrievalProposer", "StepContext"]
